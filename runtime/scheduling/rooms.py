"""Room: which endpoints can take a queued request now, as one pump round of the dispatcher sees it.

An endpoint has room when the pool's :class:`~runtime.scheduling.interfaces.SaturationDetector`
says so, over the router's in-flight count against the endpoint's capacity and the scraped
engine gauges. One round computes a version's room once and reuses it for every request of that
version it looks at. A request for a LoRA adapter gets room of its own: the endpoints the
adapters' hold rule allows after the time it has waited (:meth:`Placement.adapter_room`: a
replica holding the adapter with a batch slot, or any with room once it has waited about as long
as requests usually wait here, less the adapter's load time), so it is computed per request.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.routing.adapters import RecentWaits
from runtime.scheduling.grant import Ticket
from runtime.scheduling.interfaces import QueuedRequest, SaturationDetector
from runtime.scheduling.ports import Placement
from runtime.snapshot import EndpointSnap


def roomy(
    placement: Placement, detector: SaturationDetector, version: int, exclude: frozenset[int]
) -> list[EndpointSnap]:
    """The endpoints of ``version`` (less ``exclude``) that have room now."""
    out: list[EndpointSnap] = []
    for endpoint in placement.candidates(version, exclude):
        inflight, load = placement.load(endpoint)
        if detector.has_room(inflight=inflight, capacity=endpoint.capacity, metrics=load):
            out.append(endpoint)
    return out


def room_for(
    placement: Placement,
    detector: SaturationDetector,
    ticket: Ticket,
    *,
    waited_s: float,
    waits: RecentWaits,
) -> list[EndpointSnap]:
    """The endpoints with room for ``ticket``; for a LoRA adapter, those the adapters' hold
    rule allows after ``waited_s`` in the queue."""
    found = roomy(placement, detector, ticket.version, frozenset())
    if ticket.adapter is None or not found:
        return found
    return list(placement.adapter_room(
        ticket.version, found, ticket.adapter,
        waited_s=waited_s, typical_wait_s=waits.quantile(),
    ))  # fmt: skip


class Rooms:
    """One pump round's room per queued request (the round's ``has_room`` predicate)."""

    __slots__ = ("_by_key", "_detector", "_now", "_placement", "_ticket_of", "_waits")

    def __init__(
        self,
        placement: Placement,
        detector: SaturationDetector,
        ticket_of: Callable[[str], Ticket],
        waits: RecentWaits,
        now: float,
    ) -> None:
        self._placement, self._detector = placement, detector
        self._ticket_of, self._waits, self._now = ticket_of, waits, now
        self._by_key: dict[int | str, list[EndpointSnap]] = {}

    def has_room(self, req: QueuedRequest) -> bool:
        """Whether some endpoint can take ``req`` now (remembered for :meth:`of`)."""
        ticket = self._ticket_of(req.id)
        if ticket.adapter is not None:  # its own room: the hold rule's, by its wait
            self._by_key[req.id] = room_for(
                self._placement, self._detector, ticket,
                waited_s=self._now - req.arrived_at, waits=self._waits,
            )  # fmt: skip
            return bool(self._by_key[req.id])
        if ticket.version not in self._by_key:
            self._by_key[ticket.version] = roomy(
                self._placement, self._detector, ticket.version, frozenset()
            )
        return bool(self._by_key[ticket.version])

    def of(self, req: QueuedRequest) -> list[EndpointSnap]:
        """The endpoints :meth:`has_room` found for ``req`` (it must have been asked)."""
        ticket = self._ticket_of(req.id)
        return self._by_key[req.id if ticket.adapter is not None else ticket.version]
