"""Room: which endpoints can take a queued request now, as one pump round of the dispatcher sees it.

An endpoint has room when the pool's :class:`~runtime.scheduling.interfaces.SaturationDetector`
says so, over the router's in-flight count against the endpoint's capacity and the scraped
engine gauges. One round computes a version's room once and reuses it for every request of that
version it looks at. A request for a LoRA adapter gets room of its own: the endpoints the
adapters' hold rule allows after the time it has waited (:meth:`Placement.adapter_room`: a
replica holding the adapter with a batch slot, or any with room once it has waited about as long
as requests usually wait here, less the adapter's load time), so it is computed per request.
So is a request's room while some endpoint of its version is full: it may hold for a full one
that holds its prompt's prefix (:meth:`Placement.prefix_room`). A preempted request that
waits to resume gets its own room too, with resume affinity: its home endpoint alone, or
none while it holds for it (:mod:`.resume_home`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from runtime.routing.adapters import RecentWaits
from runtime.scheduling.grant import Ticket
from runtime.scheduling.interfaces import QueuedRequest, SaturationDetector
from runtime.scheduling.ports import Placement
from runtime.scheduling.resume_home import ResumeHomes
from runtime.snapshot import EndpointSnap


def roomy(
    placement: Placement, detector: SaturationDetector, version: int, exclude: frozenset[int]
) -> list[EndpointSnap]:
    """The endpoints of ``version`` (less ``exclude``) that have room now."""
    return _room(placement, detector, version, exclude)[0]


def _room(
    placement: Placement,
    detector: SaturationDetector,
    version: int,
    exclude: frozenset[int],
    candidates: Sequence[EndpointSnap] | None = None,
) -> tuple[list[EndpointSnap], Sequence[EndpointSnap]]:
    """:func:`roomy` and the candidates it looked at (``candidates``: already looked up)."""
    out: list[EndpointSnap] = []
    if candidates is None:
        candidates = placement.candidates(version, exclude)
    for endpoint in candidates:
        inflight, load = placement.load(endpoint)
        if detector.has_room(inflight=inflight, capacity=endpoint.capacity, metrics=load):
            out.append(endpoint)
    return out, candidates


def _prefix_room(
    placement: Placement,
    ticket: Ticket,
    found: Sequence[EndpointSnap],
    candidates: Sequence[EndpointSnap],
    waited_s: float,
) -> list[EndpointSnap]:
    """``found``, or none while the request holds for a full endpoint (some are full)."""
    if not found or len(found) >= len(candidates):
        return list(found)
    return list(placement.prefix_room(
        found, candidates, ticket.affinity_key, prefix=ticket.prefix, waited_s=waited_s,
    ))  # fmt: skip


def room_for(
    placement: Placement,
    detector: SaturationDetector,
    ticket: Ticket,
    *,
    waited_s: float,
    waits: RecentWaits,
    candidates: Sequence[EndpointSnap] | None = None,
) -> list[EndpointSnap]:
    """The endpoints with room for ``ticket``; for a LoRA adapter, those the adapters' hold
    rule allows after ``waited_s`` in the queue; for another request, none while it holds for
    a full endpoint holding its prompt's prefix. ``candidates``: its version's candidates,
    when the caller already looked them up (the dispatcher's fast path)."""
    found, candidates = _room(placement, detector, ticket.version, frozenset(), candidates)
    if ticket.adapter is None:
        return _prefix_room(placement, ticket, found, candidates, waited_s)
    if not found:
        return found
    return list(placement.adapter_room(
        ticket.version, found, ticket.adapter,
        waited_s=waited_s, typical_wait_s=waits.quantile(),
    ))  # fmt: skip


class Rooms:
    """One pump round's room per queued request (the round's ``has_room`` predicate)."""

    __slots__ = ("_by_key", "_detector", "_homes", "_now", "_placement", "_ticket_of",
                 "_versions", "_waits")  # fmt: skip

    def __init__(
        self,
        placement: Placement,
        detector: SaturationDetector,
        ticket_of: Callable[[str], Ticket],
        waits: RecentWaits,
        now: float,
        *,
        homes: ResumeHomes | None = None,
    ) -> None:
        self._placement, self._detector, self._homes = placement, detector, homes
        self._ticket_of, self._waits, self._now = ticket_of, waits, now
        self._by_key: dict[int | str, list[EndpointSnap]] = {}
        self._versions: dict[int, Sequence[EndpointSnap]] = {}  # version -> its candidates

    def has_room(self, req: QueuedRequest) -> bool:
        """Whether some endpoint can take ``req`` now (remembered for :meth:`of`)."""
        ticket = self._ticket_of(req.id)
        if ticket.adapter is not None:  # its own room: the hold rule's, by its wait
            self._by_key[req.id] = room_for(
                self._placement, self._detector, ticket,
                waited_s=self._now - req.arrived_at, waits=self._waits,
            )  # fmt: skip
            return bool(self._by_key[req.id])
        version = ticket.version
        if version not in self._by_key:
            self._by_key[version], self._versions[version] = _room(
                self._placement, self._detector, version, frozenset()
            )
        found, candidates = self._by_key[version], self._versions[version]
        if self._homes is not None and self._homes.home(req.id) is not None:  # a resume
            self._by_key[req.id] = list(self._homes.room(req.id, found, candidates, self._now))
            return bool(self._by_key[req.id])
        if found and len(found) < len(candidates):  # some are full: its own room
            self._by_key[req.id] = _prefix_room(
                self._placement, ticket, found, candidates, self._now - req.arrived_at
            )
            return bool(self._by_key[req.id])
        self._by_key.pop(req.id, None)
        return bool(found)

    def of(self, req: QueuedRequest) -> list[EndpointSnap]:
        """The endpoints :meth:`has_room` found for ``req`` (it must have been asked)."""
        own = self._by_key.get(req.id)
        return own if own is not None else self._by_key[self._ticket_of(req.id).version]
