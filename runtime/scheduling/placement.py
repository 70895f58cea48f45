"""The dispatcher's view of the fleet, over the router's routing table and live signals.

:class:`FleetPlacement` implements :class:`~runtime.scheduling.dispatcher.Placement` for one
pool: candidate endpoints are those of the version that pass the pool's routing filters
(ready, circuit closed, healthy, ...); the choice among those with room uses the pool's
scorers and picker with the request's prompt-prefix key, unless the request carries its
prompt's block hashes and the prefix placer's sticky rule keeps it on the endpoint holding its
longest cached prefix (:mod:`runtime.routing.prefix_placer`; the placer then learns where the
prefix went); the load is the router's own
in-flight count (the immediate signal) and the health monitor's last scrape of
``vllm:kv_cache_usage_perc`` and ``vllm:num_requests_waiting`` with its age. Taking and
freeing a slot moves the shared in-flight count and its Prometheus gauge. A request that
names a LoRA adapter is scored with the router's residency book (``residency``), so the
``adapter_residency`` scorer sees where the adapter is resident before the grant, and
:meth:`FleetPlacement.adapter_room` applies the adapters' hold rule
(:func:`runtime.routing.adapters.adapter_room`) for the dispatcher.

The scraped waiting count is read against the router's own dispatches: a request sent less
than ``fresh_s`` before the scrape may simply not have reached the engine's next step yet
(an engine admits new requests only between steps), so up to that many waiting requests are
not taken as a sign of saturation. A request still waiting longer than that is.

What does not change between snapshots is looked up once per snapshot (:class:`_Layout`: each
version's endpoints and selector, the pool's endpoints with their filters), so a request pays
only for the live filters (ready, circuit, health), not for the table's lookups.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence

from runtime.routing.adapters import ResidencyBook, adapter_room
from runtime.routing.endpoints import EndpointFilter, EndpointSelector, EndpointSignals
from runtime.routing.inflight import InFlight
from runtime.routing.prefix import PromptPrefix
from runtime.routing.prefix_placer import PrefixPlacer
from runtime.routing.signals import RequestSignals
from runtime.routing.table import RoutingTable
from runtime.scheduling.interfaces import EndpointLoad
from runtime.snapshot import EndpointSnap, Snapshot
from runtime.upstream.health import HealthMonitor

SlotListener = Callable[[int, int], None]
"""Called with (endpoint id, +1 or -1) when a slot is taken or freed (metrics)."""

Filters = tuple[EndpointFilter, ...]


def _keeps(endpoint: EndpointSnap, filters: Filters, signals: EndpointSignals) -> bool:
    """Whether every filter keeps ``endpoint`` (:meth:`EndpointSelector.eligible`'s rule)."""
    for kept in filters:  # noqa: SIM110 - a loop, not a generator per endpoint (fast path)
        if not kept.keep(endpoint, signals):
            return False
    return True


class _Layout:
    """One snapshot's routing lookups for one pool (snapshots are immutable)."""

    __slots__ = ("members", "snapshot", "versions")

    def __init__(self, snapshot: Snapshot, pool: str, table: RoutingTable) -> None:
        self.snapshot = snapshot
        self.versions: dict[int, tuple[tuple[EndpointSnap, ...], EndpointSelector]] = {}
        self.members: tuple[tuple[EndpointSnap, Filters], ...] = tuple(
            (endpoint, table.selector(snapshot, endpoint.version).filters)
            for endpoint in snapshot.endpoints.values()
            if endpoint.pool == pool
        )

    def version(
        self, version: int, table: RoutingTable
    ) -> tuple[tuple[EndpointSnap, ...], EndpointSelector]:
        found = self.versions.get(version)
        if found is None:
            found = self.versions[version] = (
                table.endpoints(self.snapshot, version),
                table.selector(self.snapshot, version),
            )
        return found


class FleetPlacement:
    __slots__ = ("_clock", "_fresh_s", "_health", "_inflight", "_layout", "_on_slot", "_prefix",
                 "_residency", "_sent",
                 "_signals", "_snapshot", "_table", "pool")  # fmt: skip

    def __init__(
        self,
        pool: str,
        *,
        snapshot: Callable[[], Snapshot | None],
        table: RoutingTable,
        signals: EndpointSignals,
        health: HealthMonitor,
        inflight: InFlight,
        clock: Callable[[], float],
        on_slot: SlotListener | None = None,
        fresh_s: float = 0.25,
        residency: ResidencyBook | None = None,
        prefix: PrefixPlacer | None = None,
    ) -> None:
        self.pool = pool
        self._snapshot = snapshot
        self._table = table
        self._signals = signals
        self._health = health
        self._inflight = inflight
        self._clock = clock
        self._on_slot = on_slot
        self._fresh_s = fresh_s
        self._residency = residency
        self._prefix = prefix
        self._sent: dict[int, collections.deque[float]] = {}  # endpoint -> recent dispatches
        self._layout: _Layout | None = None

    def _current(self) -> _Layout | None:
        """The current snapshot's layout (built on the first request that sees it)."""
        snapshot = self._snapshot()
        if snapshot is None:
            return None
        layout = self._layout
        if layout is None or layout.snapshot is not snapshot:
            layout = self._layout = _Layout(snapshot, self.pool, self._table)
        return layout

    def candidates(self, version: int, exclude: frozenset[int]) -> Sequence[EndpointSnap]:
        layout = self._current()
        if layout is None:
            return ()
        endpoints, selector = layout.version(version, self._table)
        signals, filters = self._signals, selector.filters
        return [
            e for e in endpoints if e.id not in exclude and _keeps(e, filters, signals)
        ]  # fmt: skip

    def load(self, endpoint: EndpointSnap) -> tuple[int, EndpointLoad]:
        inflight = self._inflight.get(endpoint.id)
        status = self._health.status(endpoint.id)
        if status is None or status.last_scrape is None:
            return inflight, EndpointLoad()
        waiting = status.waiting
        if waiting:
            waiting = max(0.0, waiting - self._sent_before(endpoint.id, status.last_scrape))
        return inflight, EndpointLoad(
            kv_usage=status.kv_usage,
            waiting=waiting,
            age_s=max(self._clock() - status.last_scrape, 0.0),
        )

    def choose(
        self,
        endpoints: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        adapter: str | None = None,
        prefix: PromptPrefix | None = None,
    ) -> EndpointSnap:
        layout = self._current()
        if layout is None:
            return endpoints[0]
        placer = self._prefix if prefix is not None else None
        match = None if placer is None or prefix is None else placer.match(prefix, endpoints)
        chosen: EndpointSnap | None = None
        if len(endpoints) == 1:
            chosen = endpoints[0]
        elif placer is not None and match is not None:
            chosen = placer.sticky(endpoints, match, self._inflight.get)
        if chosen is None:
            selector = layout.version(endpoints[0].version, self._table)[1]
            signals = RequestSignals(
                self._signals, layout.snapshot, affinity_key, match,
                adapter=adapter, residency=self._residency,
            )  # fmt: skip
            chosen = selector.picker.pick([(e, selector.score(e, signals)) for e in endpoints])
        if placer is not None and prefix is not None and match is not None:
            placer.sent(chosen.id, prefix, match)
        return chosen

    def adapter_room(
        self,
        version: int,
        roomy: Sequence[EndpointSnap],
        adapter: str,
        *,
        waited_s: float,
        typical_wait_s: float,
    ) -> Sequence[EndpointSnap]:
        book = self._residency
        if book is None:
            return roomy
        candidates = self.candidates(version, frozenset())
        return adapter_room(
            roomy, candidates, lambda eid: book.adapter_signal(eid, adapter),
            waited_s=waited_s, typical_wait_s=typical_wait_s,
        )  # fmt: skip

    def prefix_room(
        self,
        roomy: Sequence[EndpointSnap],
        candidates: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        prefix: PromptPrefix | None,
        waited_s: float,
    ) -> Sequence[EndpointSnap]:
        if prefix is None or self._prefix is None:
            return roomy
        return self._prefix.room(prefix, roomy, candidates, waited_s=waited_s)

    def _sent_before(self, endpoint_id: int, scraped: float) -> int:
        """Requests dispatched to the endpoint within ``fresh_s`` before ``scraped``."""
        count = 0
        for sent_at in reversed(self._sent.get(endpoint_id, ())):
            if sent_at > scraped:
                continue
            if sent_at < scraped - self._fresh_s:
                break
            count += 1
        return count

    def fallback(
        self,
        version: int,
        exclude: frozenset[int],
        affinity_key: str | None,
        *,
        prefix: PromptPrefix | None = None,
    ) -> EndpointSnap | None:
        snapshot = self._snapshot()
        if snapshot is None:
            return None
        signals = RequestSignals(self._signals, snapshot, affinity_key)
        chosen = self._table.pick(snapshot, version, signals, exclude)
        if chosen is not None and prefix is not None and self._prefix is not None:
            self._prefix.sent(chosen.id, prefix, self._prefix.match(prefix, (chosen,)))
        return chosen

    def capacity(self) -> int:
        layout = self._current()
        if layout is None:
            return 0
        signals = self._signals
        return sum(
            endpoint.capacity
            for endpoint, filters in layout.members
            if _keeps(endpoint, filters, signals)
        )

    def acquire(self, endpoint_id: int) -> None:
        now = self._clock()
        sent = self._sent.get(endpoint_id)
        if sent is None:
            sent = self._sent[endpoint_id] = collections.deque()
        while sent and sent[0] < now - max(2.0, 4 * self._fresh_s):
            sent.popleft()
        sent.append(now)
        self._inflight.acquire(endpoint_id)
        if self._on_slot is not None:
            self._on_slot(endpoint_id, 1)

    def release(self, endpoint_id: int) -> None:
        self._inflight.release(endpoint_id)
        if self._on_slot is not None:
            self._on_slot(endpoint_id, -1)
