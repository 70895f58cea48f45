"""Which LoRA adapters one replica holds: an LRU with a minimum residency time.

An engine holds at most ``max_loras`` adapters at once. :class:`AdapterSlots` decides, for an
adapter a request needs, whether it is resident (a hit: it becomes the most recently used),
whether one resident adapter must be evicted first (the least recently used among those
resident for at least ``min_residency_s``: a fresh load is never thrown out at once, so two
adapters cannot thrash one slot), or whether every slot is pinned (each adapter loaded less
than ``min_residency_s`` ago): then the caller answers 429 with the returned Retry-After.

Pure bookkeeping: the caller loads and unloads through the engine's runtime API
(``/v1/load_lora_adapter``, ``/v1/unload_lora_adapter``) and reports the outcome with
:meth:`AdapterSlots.loaded` / :meth:`AdapterSlots.unloaded`. Time is passed in (``now``,
monotonic seconds), so the rule is tested without a clock.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

# Adapter slots per replica: what the launcher gives an engine that serves adapters and what
# the router's per-replica bookkeeping assumes (runtime.workers.adapter_loader.AdapterFleet).
DEFAULT_MAX_LORAS = 2


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

    __slots__ = ("_loaded_at", "_used", "max_loras", "min_residency_s")

    def __init__(self, *, max_loras: int, min_residency_s: float = 30.0) -> None:
        if max_loras < 1:
            raise ValueError("max_loras must be >= 1")
        if min_residency_s < 0:
            raise ValueError("min_residency_s must be >= 0")
        self.max_loras = max_loras
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

    def decide(self, name: str, *, now: float) -> Decision:
        """What serving ``name`` takes now; a hit counts as a use (it moves to the MRU end)."""
        if name in self._used:
            self._used.move_to_end(name)
            return Resident(name)
        if len(self._used) < self.max_loras:
            return Load(name)
        for victim in self._used:  # LRU first
            if now - self._loaded_at[victim] >= self.min_residency_s:
                return Load(name, evict=victim)
        youngest_free = min(self._loaded_at[v] for v in self._used) + self.min_residency_s
        return Pinned(retry_after_s=max(youngest_free - now, 0.0))

    def loaded(self, name: str, *, now: float) -> None:
        """``name`` is now resident (most recently used), its residency clock starting."""
        self._used[name] = None
        self._used.move_to_end(name)
        self._loaded_at[name] = now

    def unloaded(self, name: str) -> None:
        """``name`` is no longer resident (evicted, or the engine lost it)."""
        self._used.pop(name, None)
        self._loaded_at.pop(name, None)

    def touch(self, name: str) -> None:
        """A request used ``name`` (resident): it becomes the most recently used."""
        if name in self._used:
            self._used.move_to_end(name)
