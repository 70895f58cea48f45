"""Where a request for a LoRA adapter goes, and one load per adapter at a time.

:func:`adapter_choice` is the placement rule, a pure function over what the router knows of
each replica of the adapter's base version (whether the adapter is resident there, its
in-flight count and capacity, its measured adapter load time, whether its slots are all pinned
by minimum residency, :mod:`runtime.workers.adapters`):

1. a replica where the adapter is resident and that is not saturated (the prefix rule's
   "sticky until saturated", :class:`runtime.routing.sticky.StickyRule`'s ``max_load``): the
   least loaded of them;
2. else the replica that can load it (a free or evictable slot) whose queueing estimate plus
   load time is least: ``in_flight / capacity * service_s + load_s``; it loads the adapter;
3. else a saturated replica where it is resident (queueing there beats refusing);
4. else every replica's slots are pinned: :class:`AllPinned` with the soonest Retry-After
   (the caller answers 429).

:class:`SingleFlight` makes concurrent first requests for one adapter on one replica share one
load, and remembers a failed load for a cool-down so a broken adapter is answered 503 with
Retry-After rather than reloaded on every request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass

from runtime.routing.sticky import StickyRule

DEFAULT_MAX_LOAD = StickyRule().max_load


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What the router knows of one replica of the base version, for one adapter."""

    endpoint: int
    resident: bool
    in_flight: int
    capacity: int
    load_s: float = 0.0  # measured adapter load time on this replica
    pinned_for_s: float | None = None  # all slots pinned: seconds until one frees; None: free

    def saturated(self, max_load: float) -> bool:
        return self.in_flight >= self.capacity * max_load

    def load(self) -> float:
        return self.in_flight / max(self.capacity, 1)


@dataclass(frozen=True, slots=True)
class Choice:
    endpoint: int
    needs_load: bool


@dataclass(frozen=True, slots=True)
class AllPinned:
    retry_after_s: float


def adapter_choice(
    replicas: Sequence[ReplicaView], *, service_s: float, max_load: float = DEFAULT_MAX_LOAD
) -> Choice | AllPinned | None:
    """The replica for the next request of an adapter (None: no replica at all)."""
    if not replicas:
        return None
    resident = [r for r in replicas if r.resident]
    light = [r for r in resident if not r.saturated(max_load)]
    if light:
        best = min(light, key=lambda r: (r.load(), r.endpoint))
        return Choice(best.endpoint, needs_load=False)
    loadable = [r for r in replicas if not r.resident and r.pinned_for_s is None]
    if loadable:
        best = min(loadable, key=lambda r: (r.load() * service_s + r.load_s, r.endpoint))
        return Choice(best.endpoint, needs_load=True)
    if resident:
        best = min(resident, key=lambda r: (r.load(), r.endpoint))
        return Choice(best.endpoint, needs_load=False)
    waits = [r.pinned_for_s for r in replicas if r.pinned_for_s is not None]
    return AllPinned(retry_after_s=min(waits) if waits else 1.0)


class LoadFailedError(Exception):
    """An adapter's load failed; ``retry_after_s`` is what is left of its cool-down."""

    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after_s = retry_after_s


class SingleFlight:
    """One load per key at a time; a failure is remembered for ``cooldown_s``."""

    __slots__ = ("_clock", "_failed", "_flights", "cooldown_s")

    def __init__(
        self, *, cooldown_s: float = 10.0, clock: Callable[[], float] | None = None
    ) -> None:
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._flights: dict[Hashable, asyncio.Future[None]] = {}
        self._failed: dict[Hashable, tuple[float, str]] = {}

    def _now(self) -> float:
        return self._clock() if self._clock is not None else asyncio.get_running_loop().time()

    async def run(
        self, key: Hashable, load: Callable[[], Awaitable[None]],
        *, passthrough: tuple[type[Exception], ...] = (),
    ) -> bool:  # fmt: skip
        """Run ``load`` for ``key`` unless one is in flight (then wait for it). True when
        this call ran the load. Raises :class:`LoadFailedError` for a failed or cooling load;
        an exception of a ``passthrough`` type reaches every waiter but is not remembered."""
        failed = self._failed.get(key)
        if failed is not None:
            left = failed[0] - self._now()
            if left > 0:
                raise LoadFailedError(failed[1], left)
            del self._failed[key]
        flight = self._flights.get(key)
        if flight is not None:
            await asyncio.shield(flight)
            return False
        flight = asyncio.get_running_loop().create_future()
        self._flights[key] = flight
        try:
            await load()
        except passthrough as exc:
            flight.set_exception(exc)
            flight.exception()
            raise
        except Exception as exc:  # the loader's reason goes to every waiter
            self._failed[key] = (self._now() + self.cooldown_s, str(exc) or type(exc).__name__)
            error = LoadFailedError(self._failed[key][1], self.cooldown_s)
            flight.set_exception(error)
            flight.exception()  # retrieved: no "never retrieved" warning without waiters
            raise error from exc
        else:
            flight.set_result(None)
        finally:
            del self._flights[key]
        return True
