"""One pool's queue: priority bands, then fair share across tenants, then order per tenant.

``pop`` picks the band by strict priority tempered by the guaranteed minimum shares of
:mod:`runtime.scheduling.shares`, the tenant within the band by the fairness policy (one
fairness state per band, so batch use does not count against a tenant's interactive
traffic), and the request within the tenant by the ordering policy. It charges the input
tokens to the tenant at dispatch; output tokens are charged with :meth:`PoolQueue.charge_output`
as they stream back. Everything is synchronous and single-threaded (one event loop).

The dispatcher's loop: ``expire(now)`` (answer those 504), then, while an endpoint has room
(:mod:`runtime.scheduling.saturation`), ``pop()`` and send; ``charge_output`` as tokens
stream; ``remove`` on client disconnect. ``pop`` does not look at the clock.

Requests removed before dispatch (cancelled, expired, shed) are deleted lazily from the
heaps; heaps are compacted when dead entries outnumber live ones.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.scheduling.estimate import Ahead, BandView, TenantView, estimate_ahead
from runtime.scheduling.interfaces import FairnessPolicy, OrderingPolicy, QueuedRequest
from runtime.scheduling.shares import BandShares


class QueueFull(Exception):  # noqa: N818 - the name callers and the issue use
    """The request's band (``band`` set) or the whole pool (``band`` None) is at its bound."""

    def __init__(self, *, band: int | None, limit: int) -> None:
        where = "the pool queue" if band is None else f"band {band}"
        super().__init__(f"{where} is full ({limit} queued)")
        self.band = band
        self.limit = limit


@dataclass(slots=True, eq=False)
class _Entry:
    req: QueuedRequest
    less: Callable[[QueuedRequest, QueuedRequest], bool]
    alive: bool = True

    def __lt__(self, other: _Entry) -> bool:
        return self.less(self.req, other.req)


@dataclass(slots=True, eq=False)
class _TenantQueue:
    heap: list[_Entry] = field(default_factory=list)
    length: int = 0
    cost: float = 0.0
    weight: float = 1.0


@dataclass(slots=True, eq=False)
class _Band:
    state: Any
    tenants: dict[str, _TenantQueue] = field(default_factory=dict)
    length: int = 0
    cost: float = 0.0


@dataclass(frozen=True, slots=True)
class BandStats:
    length: int
    cost: float  # estimated token cost queued
    oldest_arrival: float | None  # arrived_at of the longest-waiting request


def shed_key(req: QueuedRequest) -> tuple[int, int, int, int, int]:
    """Smaller sheds first: shadow; then lower class shed_order; over-quota before
    within-quota at the same level; then the less urgent band; then the newest arrival."""
    return (
        0 if req.is_shadow else 1,
        req.shed_order,
        0 if req.over_quota else 1,
        -req.band,
        -req.seq,
    )


class PoolQueue:
    """The queue of one pool. See the module docstring; bounds are request counts."""

    def __init__(
        self,
        *,
        fairness: FairnessPolicy[Any],
        ordering: OrderingPolicy,
        band_min_shares: Mapping[int, float] | None = None,
        max_len_per_band: Mapping[int, int] | None = None,
        default_max_len: int | None = None,
        max_total: int | None = None,
    ) -> None:
        limits = dict(max_len_per_band or {})
        for name, value in [*limits.items(), ("default", default_max_len), ("total", max_total)]:
            if value is not None and value < 1:
                raise ValueError(f"queue bound {name!r} must be >= 1, got {value!r}")
        self._fairness = fairness
        self._less = ordering.less
        self._shares = BandShares(band_min_shares)
        self._limits = limits
        self._default_limit = default_max_len
        self._max_total = max_total
        self._bands: dict[int, _Band] = {}
        self._entries: dict[str, _Entry] = {}
        self._deadlines: list[tuple[float, int, str]] = []

    # -- size -------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._entries

    def get(self, req_id: str) -> QueuedRequest | None:
        entry = self._entries.get(req_id)
        return None if entry is None else entry.req

    def band_lengths(self) -> dict[int, int]:
        return {band: b.length for band, b in sorted(self._bands.items()) if b.length}

    def backlogged(self, band: int) -> frozenset[str]:
        """The tenants with requests queued in ``band``."""
        b = self._bands.get(band)
        return frozenset(b.tenants) if b is not None else frozenset()

    def limit(self, band: int) -> int | None:
        return self._limits.get(band, self._default_limit)

    def deficit(self, band: int) -> float:
        return self._shares.deficit(band)

    def counter(self, band: int, tenant: str) -> float:
        """The fairness policy's counter of ``tenant`` in ``band`` (0 if never seen)."""
        b = self._bands.get(band)
        return 0.0 if b is None else self._fairness.counter(b.state, tenant)

    def stats(self) -> dict[int, BandStats]:
        out: dict[int, BandStats] = {}
        for band, b in sorted(self._bands.items()):
            arrivals = [e.req.arrived_at for t in b.tenants.values() for e in t.heap if e.alive]
            out[band] = BandStats(b.length, b.cost, min(arrivals) if arrivals else None)
        return out

    def has_room_for(self, band: int) -> bool:
        """One more request of ``band`` fits without shedding anyone."""
        b = self._bands.get(band)
        limit = self.limit(band)
        if limit is not None and b is not None and b.length >= limit:
            return False
        return self._max_total is None or len(self._entries) < self._max_total

    # -- in ---------------------------------------------------------------------------

    def push(self, req: QueuedRequest) -> list[QueuedRequest]:
        """Queue ``req``; returns the requests shed to make room under ``max_total``.

        Raises :class:`QueueFull` when its band is at its bound, or when the pool is at
        ``max_total`` and no queued request is more sheddable than ``req``
        (see :func:`shed_key`). Raises ``ValueError`` for an id already queued.
        """
        if req.id in self._entries:
            raise ValueError(f"request {req.id!r} is already queued")
        band = self._bands.get(req.band)
        limit = self.limit(req.band)
        if limit is not None and band is not None and band.length >= limit:
            raise QueueFull(band=req.band, limit=limit)
        displaced: list[QueuedRequest] = []
        if self._max_total is not None and len(self._entries) >= self._max_total:
            victim = min((e.req for e in self._entries.values()), key=shed_key)
            if shed_key(victim) >= shed_key(req):
                raise QueueFull(band=None, limit=self._max_total)
            displaced.append(self._drop(self._entries[victim.id]))
        if band is None:
            band = self._bands[req.band] = _Band(state=self._fairness.new_state())
        tenant = band.tenants.get(req.tenant)
        if tenant is None:
            self._fairness.on_backlogged(band.state, req.tenant, band.tenants.keys())
            tenant = band.tenants[req.tenant] = _TenantQueue()
        entry = _Entry(req, self._less)
        heapq.heappush(tenant.heap, entry)
        tenant.weight = req.weight
        tenant.length += 1
        tenant.cost += req.cost
        band.length += 1
        band.cost += req.cost
        self._entries[req.id] = entry
        if math.isfinite(req.deadline):
            heapq.heappush(self._deadlines, (req.deadline, req.seq, req.id))
        return displaced

    # -- out --------------------------------------------------------------------------

    def pop(
        self, admissible: Callable[[QueuedRequest], bool] | None = None, *, deep: bool = False
    ) -> QueuedRequest | None:
        """The next request to dispatch (input tokens charged), or None when none may go.

        With ``admissible``, only tenants whose head request (the one their ordering puts
        first) passes it are considered, and only bands holding such a tenant: a head that
        cannot go now (its endpoints are full) holds back its own tenant, never the others.
        With ``deep``, a tenant's first request in its order that passes stands for it
        instead (a lent slot's bound on prompts, :mod:`.lent_prefill`).
        """
        if not self._entries:
            return None
        heads_of: dict[int, dict[str, QueuedRequest]] = {}
        if admissible is None:
            backlogged = [band for band, b in sorted(self._bands.items()) if b.length]
        else:
            for number, b in sorted(self._bands.items()):
                ready = {
                    name: head
                    for name, t in b.tenants.items()
                    if (head := _first(t.heap, admissible, deep=deep)) is not None
                }
                if ready:
                    heads_of[number] = ready
            backlogged = list(heads_of)
            if not backlogged:
                return None
        chosen = self._shares.choose(backlogged)
        band = self._bands[chosen]
        heads = heads_of.get(chosen) or {name: t.heap[0].req for name, t in band.tenants.items()}
        name = self._fairness.pick(band.state, heads)
        tenant = band.tenants.get(name)
        if tenant is None:
            raise RuntimeError(
                f"fairness policy {self._fairness.name!r} picked {name!r}, "
                f"which is not a backlogged tenant of band {chosen}"
            )
        req = heads[name]
        entry = self._entries[req.id]
        if tenant.heap[0] is entry:
            heapq.heappop(tenant.heap)
        self._drop(entry)  # (deeper in the heap: dropped lazily)
        self._shares.record(backlogged, chosen, req.cost)
        self._fairness.charge(band.state, name, weight=req.weight, input_tokens=req.input_tokens)
        return req

    def pass_through(self, req: QueuedRequest) -> None:
        """Account ``req`` dispatched straight from an empty queue: exactly what ``push`` then
        ``pop`` would do to the fairness state and band shares, without touching the heaps.
        Raises ``RuntimeError`` when something is queued (it would overtake it)."""
        if self._entries:
            raise RuntimeError("pass_through with requests queued would overtake them")
        band = self._bands.get(req.band)
        if band is None:
            band = self._bands[req.band] = _Band(state=self._fairness.new_state())
        self._fairness.on_backlogged(band.state, req.tenant, ())
        self._fairness.pick(band.state, {req.tenant: req})  # policies remember the last pick
        self._shares.record([req.band], req.band, req.cost)
        self._fairness.charge(
            band.state, req.tenant, weight=req.weight, input_tokens=req.input_tokens
        )

    def charge_output(self, req: QueuedRequest, output_tokens: int) -> None:
        """Charge output tokens of a dispatched request as they stream back."""
        band = self._bands.get(req.band)
        if band is None:
            raise KeyError(f"band {req.band} has never held a request")
        self._fairness.charge(
            band.state, req.tenant, weight=req.weight, output_tokens=output_tokens
        )

    def charge(
        self, band: int, tenant: str, *, weight: float, input_tokens: int, output_tokens: int
    ) -> None:
        """Charge service that bypassed the queue (a cache hit) to ``tenant`` in ``band``."""
        self.lift_counter(band, tenant, 0.0)  # make sure the band exists
        self._fairness.charge(self._bands[band].state, tenant, weight=weight,
                              input_tokens=input_tokens, output_tokens=output_tokens)  # fmt: skip

    def lift_counter(self, band: int, tenant: str, value: float) -> None:
        """Raise ``tenant``'s fairness counter in ``band`` to at least ``value`` (never lowers
        it): how service counted elsewhere (other router replicas) reaches this queue."""
        b = self._bands.get(band)
        if b is None:
            b = self._bands[band] = _Band(state=self._fairness.new_state())
        self._fairness.lift(b.state, tenant, value)

    def requests(self) -> list[QueuedRequest]:
        """Every queued request, in arrival order (to move them into a rebuilt queue)."""
        return sorted((e.req for e in self._entries.values()), key=lambda r: r.seq)

    def next_deadline(self) -> float | None:
        """The earliest deadline among the queued requests, or None."""
        deadlines = self._deadlines
        while deadlines:
            _, seq, req_id = deadlines[0]
            entry = self._entries.get(req_id)
            if entry is not None and entry.req.seq == seq:
                return deadlines[0][0]
            heapq.heappop(deadlines)
        return None

    def remove(self, req_id: str) -> QueuedRequest | None:
        """Take a queued request out (cancellation); None if it is not queued."""
        entry = self._entries.get(req_id)
        return None if entry is None else self._drop(entry)

    def expire(self, now: float) -> list[QueuedRequest]:
        """Remove and return the requests whose deadline is at or before ``now``."""
        expired: list[QueuedRequest] = []
        deadlines = self._deadlines
        while deadlines and deadlines[0][0] <= now:
            _, seq, req_id = heapq.heappop(deadlines)
            entry = self._entries.get(req_id)
            if entry is not None and entry.req.seq == seq:
                expired.append(self._drop(entry))
        return expired

    def shed_candidates(self, n: int) -> list[QueuedRequest]:
        """Up to ``n`` queued requests in the order they should be shed (not removed)."""
        return heapq.nsmallest(max(n, 0), (e.req for e in self._entries.values()), key=shed_key)

    def shed(self, n: int) -> list[QueuedRequest]:
        """Remove and return up to ``n`` requests in shed order."""
        return [self._drop(self._entries[req.id]) for req in self.shed_candidates(n)]

    # -- where a request stands ---------------------------------------------------------

    def ahead(self, req: QueuedRequest) -> Ahead:
        """Estimated requests and token cost dispatched before ``req`` (queued or not)."""
        higher = [BandView(b.length, b.cost) for band, b in self._bands.items() if band < req.band]
        band = self._bands.get(req.band)
        tenants: list[TenantView] = []
        own: list[QueuedRequest] = []
        if band is not None:
            for name, t in band.tenants.items():
                if name == req.tenant:
                    own = [e.req for e in t.heap if e.alive and e.req.id != req.id]
                else:
                    tenants.append(TenantView(t.length, t.cost, t.weight))
        return estimate_ahead(req, self._less, higher=higher, own=own, others=tenants)

    def work_ahead(self, req: QueuedRequest) -> float:
        return self.ahead(req).cost

    def position(self, req_id: str) -> int:
        """1-based estimated position of a queued request (1: it goes next)."""
        entry = self._entries.get(req_id)
        if entry is None:
            raise KeyError(f"request {req_id!r} is not queued")
        return self.ahead(entry.req).requests + 1

    # -- internals ----------------------------------------------------------------------

    def _drop(self, entry: _Entry) -> QueuedRequest:
        """Forget a live entry (already popped from its heap or not) and tidy up."""
        req = entry.req
        entry.alive = False
        del self._entries[req.id]
        band = self._bands[req.band]
        tenant = band.tenants[req.tenant]
        tenant.length -= 1
        band.length -= 1
        if tenant.length == 0:
            del band.tenants[req.tenant]
        else:
            tenant.cost -= req.cost
            heap = tenant.heap
            while not heap[0].alive:
                heapq.heappop(heap)
            if len(heap) > 2 * tenant.length + 32:
                tenant.heap = [e for e in heap if e.alive]
                heapq.heapify(tenant.heap)
        band.cost = band.cost - req.cost if band.length else 0.0
        if len(self._deadlines) > 2 * len(self._entries) + 64:
            self._deadlines = [
                (e.req.deadline, e.req.seq, e.req.id)
                for e in self._entries.values()
                if math.isfinite(e.req.deadline)
            ]
            heapq.heapify(self._deadlines)
        return req


def _first(
    heap: list[_Entry], admissible: Callable[[QueuedRequest], bool], *, deep: bool
) -> QueuedRequest | None:
    """The tenant's head if it passes ``admissible``; with ``deep``, its first request in
    order that passes (None: none)."""
    if not deep:
        return heap[0].req if admissible(heap[0].req) else None
    for entry in sorted(e for e in heap if e.alive):
        if admissible(entry.req):
            return entry.req
    return None
