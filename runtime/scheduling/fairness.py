"""Fairness policies: which backlogged tenant of a band is served next.

- :class:`VirtualTokenCounter` (``vtc``): weighted fair share by virtual token counters
  (Sheng et al., "Fairness in Serving Large Language Models", OSDI '24);
- :class:`FirstComeFirstServed` (``fcfs``) and :class:`RoundRobin` (``round_robin``):
  baselines for comparison.

All three keep the same per-tenant counter of weighted service (``counter``), so metrics and
the conformance suite read them the same way; only VTC decides by it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Generic, Protocol, TypeVar

from runtime.scheduling.interfaces import QueuedRequest, token_cost


def _weighted(tenant: str, weight: float, input_tokens: int, output_tokens: int) -> float:
    if not weight > 0:
        raise ValueError(f"tenant {tenant!r}: weight must be > 0, got {weight!r}")
    if input_tokens < 0 or output_tokens < 0:
        raise ValueError(f"tenant {tenant!r}: cannot charge a negative number of tokens")
    return token_cost(input_tokens, output_tokens) / weight


class _HasCounters(Protocol):
    counters: dict[str, float]


S = TypeVar("S", bound=_HasCounters)


class _ServiceCounters(Generic[S]):
    """The weighted service counter every policy keeps (metrics and conformance read it)."""

    __slots__ = ()

    def charge(
        self,
        state: S,
        tenant: str,
        *,
        weight: float,
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> None:
        amount = _weighted(tenant, weight, input_tokens, output_tokens)
        state.counters[tenant] = state.counters.get(tenant, 0.0) + amount

    def counter(self, state: S, tenant: str) -> float:
        return state.counters.get(tenant, 0.0)

    def lift(self, state: S, tenant: str, value: float) -> None:
        """Raise the tenant's counter to ``value``; never lowers it."""
        if value > state.counters.get(tenant, 0.0):
            state.counters[tenant] = value


def _oldest(heads: Mapping[str, QueuedRequest]) -> str:
    """The tenant whose head arrived first (sequence number, then tenant name)."""
    if not heads:
        raise ValueError("pick needs at least one backlogged tenant")
    return min(heads, key=lambda tenant: (heads[tenant].seq, tenant))


@dataclass(slots=True)
class CounterState:
    """Per-band state: each tenant's weighted service counter, and who was picked last."""

    counters: dict[str, float] = field(default_factory=dict)
    last_picked: str | None = None


class VirtualTokenCounter(_ServiceCounters[CounterState]):
    """VTC: serve the backlogged tenant with the smallest virtual counter.

    A tenant's counter advances by (input tokens + 2 * output tokens) / its weight: input is
    charged at dispatch, output as tokens stream back. Ties go to the oldest head.

    When a tenant becomes backlogged its counter is lifted to
    ``max(own, floor - allowance)``, where ``floor`` is the smallest counter among the tenants
    already backlogged, or — when none is — the counter of the tenant served last. A tenant
    that was idle therefore cannot bank service it did not ask for; ``allowance`` (in
    weighted tokens, default 0) lets a returning tenant keep a little credit. Lifting never
    lowers a counter.
    """

    name: ClassVar[str] = "vtc"
    isolates_tenants: ClassVar[bool] = True

    __slots__ = ("allowance",)

    def __init__(self, *, allowance: float = 0.0) -> None:
        if not allowance >= 0:
            raise ValueError(f"allowance must be >= 0, got {allowance!r}")
        self.allowance = allowance

    def new_state(self) -> CounterState:
        return CounterState()

    def on_backlogged(self, state: CounterState, tenant: str, active: Collection[str]) -> None:
        counters = state.counters
        others = [counters.get(other, 0.0) for other in active if other != tenant]
        if others:
            floor = min(others)
        elif state.last_picked is not None:
            floor = counters.get(state.last_picked, 0.0)
        else:
            return
        current = counters.get(tenant, 0.0)
        counters[tenant] = max(current, floor - self.allowance)

    def pick(self, state: CounterState, heads: Mapping[str, QueuedRequest]) -> str:
        if not heads:
            raise ValueError("pick needs at least one backlogged tenant")
        counters = state.counters
        chosen = min(heads, key=lambda t: (counters.get(t, 0.0), heads[t].seq, t))
        state.last_picked = chosen
        return chosen


class FirstComeFirstServed(_ServiceCounters[CounterState]):
    """Serve the tenant whose next request arrived first: one global FIFO, no isolation."""

    name: ClassVar[str] = "fcfs"
    isolates_tenants: ClassVar[bool] = False

    __slots__ = ()

    def new_state(self) -> CounterState:
        return CounterState()

    def on_backlogged(self, state: CounterState, tenant: str, active: Collection[str]) -> None:
        return

    def pick(self, state: CounterState, heads: Mapping[str, QueuedRequest]) -> str:
        chosen = _oldest(heads)
        state.last_picked = chosen
        return chosen


@dataclass(slots=True)
class RoundRobinState:
    """Turn order (tenants in order of first appearance) and the weighted service counters."""

    ring: list[str] = field(default_factory=list)
    position: dict[str, int] = field(default_factory=dict)
    last: int = -1
    counters: dict[str, float] = field(default_factory=dict)

    def join(self, tenant: str) -> None:
        if tenant not in self.position:
            self.position[tenant] = len(self.ring)
            self.ring.append(tenant)


class RoundRobin(_ServiceCounters[RoundRobinState]):
    """One request per backlogged tenant in turn, whatever the requests cost (no weights)."""

    name: ClassVar[str] = "round_robin"
    isolates_tenants: ClassVar[bool] = True

    __slots__ = ()

    def new_state(self) -> RoundRobinState:
        return RoundRobinState()

    def on_backlogged(self, state: RoundRobinState, tenant: str, active: Collection[str]) -> None:
        state.join(tenant)

    def pick(self, state: RoundRobinState, heads: Mapping[str, QueuedRequest]) -> str:
        if not heads:
            raise ValueError("pick needs at least one backlogged tenant")
        for tenant in sorted(t for t in heads if t not in state.position):
            state.join(tenant)
        size = len(state.ring)
        # The first backlogged tenant after the last one served, cyclically.
        chosen = min(heads, key=lambda t: (state.position[t] - state.last - 1) % size)
        state.last = state.position[chosen]
        return chosen
