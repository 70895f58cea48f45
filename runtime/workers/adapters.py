"""Which LoRA adapters one replica holds: an LRU with a minimum residency time.

vLLM has two limits: ``--max-loras`` is how many distinct adapters one batch may use (GPU
slots, swapped per step from host memory, cheap), ``--max-cpu-loras`` how many adapters the
engine keeps loaded at all (host memory); an adapter outside those is read from disk again
(``/v1/load_lora_adapter``, about 60 ms for the demo adapter). A *load* is that disk read,
so the router's residency list is sized to ``max_cpu_loras``: :class:`LoraSettings` reads both
from the pool's ``policies`` (``max_loras``, ``max_cpu_loras``), the launcher starts the engine
with them and the router's bookkeeping assumes the same.

An engine holds at most ``capacity`` (``max_cpu_loras``) adapters at once.
:class:`AdapterSlots` decides, for an adapter a request needs, whether it is resident (a hit:
it becomes the most recently used), whether one resident adapter must be evicted first (the
least recently used among those resident for at least ``min_residency_s``: a fresh load is
never thrown out at once, so two adapters cannot thrash one slot; among those, one also
resident on another replica goes first), or whether every slot is pinned (each adapter loaded less
than ``min_residency_s`` ago): then the caller answers 429 with the returned Retry-After.

Pure bookkeeping: the caller loads and unloads through the engine's runtime API
(``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``) and reports the outcome with
:meth:`AdapterSlots.loaded` / :meth:`AdapterSlots.unloaded`. Time is passed in (``now``,
monotonic seconds), so the rule is tested without a clock.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Mapping
from dataclasses import dataclass
from typing import Final

# Adapters per batch (vLLM ``--max-loras``) and adapters resident per replica (vLLM
# ``--max-cpu-loras``) when the pool's policies do not say: what the launcher gives an engine
# that serves adapters and what the router's per-replica bookkeeping assumes
# (runtime.workers.adapter_loader.AdapterFleet). 8 resident adapters of rank 8 on a 7B model
# are about 0.3 GB of host memory; docs/performance/2026-11-26-lora-adapters.md has the sweep.
DEFAULT_MAX_LORAS: Final = 2
DEFAULT_MAX_CPU_LORAS: Final = 8
LORA_POLICY_KEYS: Final = ("max_loras", "max_cpu_loras")
# A fresh load is not evicted for this long (no thrash): ten mean service times of the
# placement bench. 30 s refused 0.6 to 17 % of requests there (20 adapters, 8 to 12 resident
# slots, docs/performance/2026-11-26-lora-adapters.md); 10 s refused none at 14 slots.
DEFAULT_MIN_RESIDENCY_S: Final = 10.0


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """A pool's adapter slots: ``max_loras`` per batch, ``max_cpu_loras`` resident."""

    max_loras: int = DEFAULT_MAX_LORAS
    max_cpu_loras: int = DEFAULT_MAX_CPU_LORAS

    def __post_init__(self) -> None:
        if self.max_loras < 1:
            raise ValueError(f"max_loras must be >= 1, got {self.max_loras}")
        if self.max_cpu_loras < self.max_loras:
            raise ValueError(
                f"max_cpu_loras ({self.max_cpu_loras}) must be >= max_loras ({self.max_loras})"
            )

    @classmethod
    def from_policies(cls, policies: Mapping[str, str]) -> LoraSettings:
        """The pool's ``max_loras`` / ``max_cpu_loras`` (each optional; ``max_cpu_loras``
        defaults to the larger of its default and ``max_loras``). ValueError when bad."""
        max_loras = _count(policies, "max_loras", DEFAULT_MAX_LORAS)
        max_cpu = _count(policies, "max_cpu_loras", max(DEFAULT_MAX_CPU_LORAS, max_loras))
        return cls(max_loras=max_loras, max_cpu_loras=max_cpu)


def _count(policies: Mapping[str, str], key: str, default: int) -> int:
    raw = policies.get(key)
    if raw is None:
        return default
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"{key} must be a whole number, got {raw!r}") from None


@dataclass(frozen=True, slots=True)
class Resident:
    """The adapter is loaded; nothing to do."""

    name: str


@dataclass(frozen=True, slots=True)
class Load:
    """Load ``name``; unload ``evict`` first when it is set (the slot it frees)."""

    name: str
    evict: str | None = None


@dataclass(frozen=True, slots=True)
class Pinned:
    """Every slot holds an adapter younger than the minimum residency: retry after this."""

    retry_after_s: float


Decision = Resident | Load | Pinned


class AdapterSlots:
    """One replica's resident adapters, least recently used first."""

    __slots__ = ("_loaded_at", "_used", "capacity", "min_residency_s")

    def __init__(self, *, capacity: int, min_residency_s: float = DEFAULT_MIN_RESIDENCY_S) -> None:
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        if min_residency_s < 0:
            raise ValueError("min_residency_s must be >= 0")
        self.capacity = capacity
        self.min_residency_s = min_residency_s
        self._used: OrderedDict[str, None] = OrderedDict()  # LRU first
        self._loaded_at: dict[str, float] = {}

    def resident(self) -> tuple[str, ...]:
        """The resident adapters, least recently used first (what the heartbeat reports)."""
        return tuple(self._used)

    def __contains__(self, name: object) -> bool:
        return name in self._used

    def __len__(self) -> int:
        return len(self._used)

    def decide(self, name: str, *, now: float, spare: Container[str] = frozenset()) -> Decision:
        """What serving ``name`` takes now; a hit counts as a use (it moves to the MRU end).
        ``spare``: adapters resident on another replica too; the least recently used of them
        is evicted first (losing it costs the pool no load), else the least recently used."""
        if name in self._used:
            self._used.move_to_end(name)
            return Resident(name)
        if len(self._used) < self.capacity:
            return Load(name)
        evictable = [v for v in self._used if now - self._loaded_at[v] >= self.min_residency_s]
        if evictable:  # LRU first
            victim = next((v for v in evictable if v in spare), evictable[0])
            return Load(name, evict=victim)
        youngest_free = min(self._loaded_at[v] for v in self._used) + self.min_residency_s
        return Pinned(retry_after_s=max(youngest_free - now, 0.0))

    def pinned_for(self, *, now: float) -> float | None:
        """Seconds until a new adapter could get a slot, when every slot is pinned by minimum
        residency; None when one is free or evictable now. Changes nothing."""
        if len(self._used) < self.capacity:
            return None
        oldest = min(self._loaded_at[v] for v in self._used)
        left = oldest + self.min_residency_s - now
        return left if left > 0 else None

    def loaded(self, name: str, *, now: float) -> None:
        """``name`` is now resident (most recently used), its residency clock starting."""
        self._used[name] = None
        self._used.move_to_end(name)
        self._loaded_at[name] = now

    def unloaded(self, name: str) -> None:
        """``name`` is no longer resident (evicted, or the engine lost it)."""
        self._used.pop(name, None)
        self._loaded_at.pop(name, None)

    def seen(self, name: str, *, now: float) -> None:
        """``name`` is resident though this bookkeeping did not load it (another router did,
        as the replica's heartbeat says): it joins as the least recently used, old enough to
        be evicted (when it was loaded is not known)."""
        if name in self._used:
            return
        self._used[name] = None
        self._used.move_to_end(name, last=False)
        self._loaded_at[name] = now - self.min_residency_s

    def touch(self, name: str) -> None:
        """A request used ``name`` (resident): it becomes the most recently used."""
        if name in self._used:
            self._used.move_to_end(name)
