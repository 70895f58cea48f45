"""Where a request for a LoRA adapter goes, and one load per adapter at a time.

:class:`AdapterResidencyScorer` (``adapter_residency``) is the placement rule as an endpoint
scorer of the pool's selector (:mod:`runtime.routing.endpoints`). The dispatcher chooses only
among endpoints with room (its saturation detector), so the pool's scorers rank those. For a
request that names an adapter, this scorer puts each replica in a tier, from what the router
knows of it (:class:`AdapterSignal`, kept by
:class:`runtime.workers.adapter_loader.AdapterFleet`):

====  =============================================================================
1.0   the adapter is *active* there (requests for it in flight: it is in the running batch)
0.8   resident (or loading) there, and the batch has a free adapter slot (``max_loras``)
0.6   not resident, a free batch slot: it loads there (``- 0.1 * load_s``, the load time)
0.3   resident, but the batch's ``max_loras`` slots hold other adapters (it waits for one)
0.2   not resident and the batch is full
0.05  resident but saturated (``in_flight >= capacity * max_load``, the prefix rule's
      "sticky until saturated", :class:`runtime.routing.sticky.StickyRule`'s ``max_load``)
0.0   not resident and every resident slot is pinned by minimum residency (a load there
      would be refused 429), or saturated and not resident
====  =============================================================================

That is "resident unless saturated, else least load plus load time" with the batch's adapter
slots counted: vLLM runs at most ``max_loras`` distinct adapters in one batch and holds back a
request whose adapter would be one too many, so the replica already running the adapter is the
stickiest (and the adapters of a pool settle on replicas instead of every replica running
every adapter). Tiers are 0.2 apart; the default scorers weigh this one 10 against
``least_load``'s 1, so the tier decides and the load breaks ties within it. A request without
an adapter scores 0.5 everywhere, which changes no ranking.

The scorer ranks only the replicas with room, so when the replica holding the adapter is full
the request would go to another, which loads it (and evicts another adapter: at 70 % load that
was most loads). :func:`adapter_room` is the *hold rule* the dispatcher applies before ranking
(:meth:`runtime.scheduling.placement.FleetPlacement.adapter_room`): a request for an adapter
waits in the queue for a replica that holds it, and has a batch slot for it, while its wait is
under the pool's 90th-percentile queue wait (:class:`RecentWaits`, over the last 1,024
dispatches) less the adapter's measured load time; past that it goes to any replica with
room. So it waits no longer than the pool's requests typically wait anyway, counting the load
it saves; at low load (waits under the load time) nothing is held. Only that request's tenant
waits with it (the queue holds back a tenant whose head cannot go, never the others).

:class:`SingleFlight` makes concurrent first requests for one adapter on one replica share one
load, and remembers a failed load for a cool-down so a broken adapter is answered 503 with
Retry-After rather than reloaded on every request.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, Protocol, TypeVar

from runtime.routing.sticky import StickyRule

if TYPE_CHECKING:
    from runtime.routing.endpoints import EndpointSignals
    from runtime.snapshot import EndpointSnap

DEFAULT_MAX_LOAD: Final = StickyRule().max_load
NOMINAL_SERVICE_S: Final = 1.0  # a request's service time, to weigh a load against queueing
E = TypeVar("E", bound="EndpointSnap")


@dataclass(frozen=True, slots=True)
class AdapterSignal:
    """What the router knows of one replica for the adapter a request names."""

    resident: bool  # resident there, or a load of it is in flight there
    load_s: float = 0.0  # measured adapter load time on this replica (0: none measured yet)
    pinned: bool = False  # not resident and every resident slot is younger than min residency
    active: int = 0  # the router's requests in flight there for this adapter
    batch_full: bool = False  # other adapters in flight there fill its max_loras batch slots


class ResidencyBook(Protocol):
    """Where the router believes each adapter is resident
    (:class:`runtime.workers.adapter_loader.AdapterFleet`: its own loads, the loads in flight,
    and what the replicas' heartbeats report)."""

    def adapter_signal(self, endpoint_id: int, name: str) -> AdapterSignal: ...


class AdapterResidencyScorer:
    """Active, then resident, then loadable, unless saturated (see the module's tiers)."""

    name = "adapter_residency"

    def score(self, endpoint: EndpointSnap, signals: EndpointSignals) -> float:
        signal = signals.adapter(endpoint.id)
        if signal is None:
            return 0.5
        saturated = signals.inflight(endpoint.id) >= max(endpoint.capacity, 1) * DEFAULT_MAX_LOAD
        if saturated:
            return 0.05 if signal.resident else 0.0
        if signal.active > 0:
            return 1.0
        if signal.resident:
            return 0.3 if signal.batch_full else 0.8
        if signal.pinned or signal.batch_full:
            return 0.0 if signal.pinned else 0.2
        return 0.6 - 0.1 * min(1.0, signal.load_s / NOMINAL_SERVICE_S)


class RecentWaits:
    """A pool's recent queue waits (the last ``window`` dispatches) and their ``quantile``
    (recomputed every ``every`` waits): how long requests typically wait there anyway."""

    __slots__ = ("_count", "_every", "_quantile", "_value", "_waits")

    def __init__(self, *, window: int = 1024, every: int = 16, quantile: float = 0.9) -> None:
        self._waits: deque[float] = deque(maxlen=window)
        self._every = every
        self._quantile = quantile
        self._count = 0
        self._value = 0.0

    def add(self, waited_s: float) -> None:
        self._waits.append(waited_s)
        self._count += 1
        if self._count % self._every == 0:
            ordered = sorted(self._waits)
            self._value = ordered[min(len(ordered) - 1, int(self._quantile * len(ordered)))]

    def quantile(self) -> float:
        return self._value


def adapter_room(
    roomy: Sequence[E],
    candidates: Sequence[E],
    signal: Callable[[int], AdapterSignal],
    *,
    waited_s: float,
    typical_wait_s: float,
) -> list[E]:
    """The endpoints with room (``roomy``, among the pool's ``candidates``) a request for an
    adapter may go to now (the module's hold rule): while it has waited less than the pool's
    typical wait less the load time, only those whose batch has a slot for it, and, when a
    candidate holds the adapter (resident or loading), only those holding it. Empty: the
    request waits in the queue (its tenant's later requests with it; other tenants go on)."""
    signals = {e.id: signal(e.id) for e in candidates}
    load_s = max((s.load_s for s in signals.values()), default=0.0)
    if waited_s >= typical_wait_s - load_s:
        return list(roomy)
    held = any(s.resident for s in signals.values())
    out = []
    for endpoint in roomy:
        found = signals.get(endpoint.id) or signal(endpoint.id)
        if not found.batch_full and (found.resident or not held):
            out.append(endpoint)
    return out


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

    def running(self, key: Hashable) -> bool:
        """True while a load for ``key`` is in flight."""
        return key in self._flights

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
