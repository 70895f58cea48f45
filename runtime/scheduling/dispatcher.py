"""The dispatcher of one pool: its queue, and the release of requests to endpoints with room.

``await acquire(ticket)`` admits the request into the pool queue — or refuses it at once:
:class:`QueueRejectedError` (429: its band is full, or its estimated wait passes its deadline) or
:class:`NoEndpointError` (503: no endpoint of its version is usable at all) — then waits until it
is released to an endpoint and returns a :class:`Grant`, which holds that endpoint's in-flight
slot until :meth:`Grant.release`. While waiting, the request may be dropped:
:class:`QueueDropError` with ``SHED`` (429, displaced by a less sheddable request when the
pool queue is full) or ``DEADLINE_EXPIRED`` (504, before it reached an engine), or
:class:`NoEndpointError` (its version lost every usable endpoint). Cancelling the waiting task
(client gone) takes the request out of the queue at once.

The *fast path*: a request arriving while nothing waits in the pool queue, whose version has an
endpoint with room and whose tenant the headroom gate lets through, takes its slot inside
``acquire`` — no queue push and pop, no future, no wake-up of the loop task — with the same
effect on the fairness counters, band shares and drain rate as the queued path
(``PoolQueue.pass_through``). It never runs while a request waits, so it overtakes no one.

The *pump* (synchronous, run on every push and release and on the loop's ticks):

1. expire the requests whose deadline passed;
2. while some queued request's version has an endpoint with room, pop the next one (band by
   strict priority with guaranteed shares, tenant by the fairness policy, request by the
   ordering policy), choose its endpoint among those with room (the pool's scorers and
   picker), take the slot and resolve the waiter.

Room: the pool's :class:`~runtime.scheduling.interfaces.SaturationDetector` over the router's
in-flight count against the endpoint's capacity and the scraped engine gauges. Tenants over
their share may not eat into the headroom kept for the others, flooding tenants may hold no
more than the others' recent peak leaves, and their requests are popped only when no other
tenant's request (of any band) may go (:mod:`.headroom`).

Several versions in one pool queue (a canary): a head request whose version has no room is
passed over for this round (``PoolQueue.pop(admissible)``); it holds back only the later
requests of its own tenant (whose order its ordering policy decides), never other tenants or
bands. The loop task ticks every ``tick_s`` while requests wait (the scraped gauges change
without any event here) and wakes at the earliest deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import math
from collections import Counter, deque
from collections.abc import Callable

from runtime.routing.adapters import RecentWaits
from runtime.scheduling.admission import Rejected, admit
from runtime.scheduling.drain import DrainRate, retry_after_s
from runtime.scheduling.grant import (
    Grant,
    NoEndpointError,
    QueueDropError,
    QueueRejectedError,
    Ticket,
)
from runtime.scheduling.headroom import Gate, HeadroomRule
from runtime.scheduling.interfaces import DropReason, QueuedRequest, token_cost
from runtime.scheduling.ports import CounterSink, Placement
from runtime.scheduling.queue import QueueFull
from runtime.scheduling.registry import PoolPolicies
from runtime.scheduling.served import ServedTokens
from runtime.scheduling.settings import PoolSettings
from runtime.snapshot import EndpointSnap

logger = logging.getLogger(__name__)

__all__ = [
    "CounterSink",
    "Grant",
    "NoEndpointError",
    "Placement",
    "PoolDispatcher",
    "QueueDropError",
    "QueueRejectedError",
    "Ticket",
]


class _Waiter:
    __slots__ = ("future", "req", "ticket")

    def __init__(self, ticket: Ticket, req: QueuedRequest, future: asyncio.Future[Grant]) -> None:
        self.ticket = ticket
        self.req = req
        self.future = future


class PoolDispatcher:
    """One pool's queue and dispatcher; :meth:`start` on a running loop, :meth:`stop` after."""

    def __init__(
        self,
        pool: str,
        settings: PoolSettings,
        placement: Placement,
        *,
        clock: Callable[[], float],
        tick_s: float = 0.05,
        sink: CounterSink | None = None,
        headroom_window_s: float = 10.0,
        cold_start: Callable[[int], float | None] | None = None,
        lend: bool = False,
        lend_reserve: int = 0,
    ) -> None:
        if not tick_s > 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s!r}")
        if lend_reserve < 0:
            raise ValueError(f"lend_reserve must be >= 0, got {lend_reserve!r}")
        self.pool = pool
        self.placement = placement
        self._clock = clock
        self._tick_s = tick_s
        self._sink = sink
        self._headroom_window_s = headroom_window_s
        # Lend: what the headroom gate would hold back may take a slot nobody else waits
        # for; the caller takes it back by preemption when a tenant the gate lets through
        # arrives (:mod:`.preempt`; the simulator does). Off by default. It lends only while
        # more than ``lend_reserve`` of the pool's slots are free: those few stay for the
        # others' next arrivals, which then need no preemption (each one costs a re-prefill).
        self._lend = lend
        self._lend_reserve = lend_reserve
        # Scale from zero: version -> expected start seconds of a replica (None: cannot).
        self._cold_start = cold_start
        self._seq = itertools.count(1)
        self._waiting: dict[str, _Waiter] = {}
        self._inflight: Counter[str] = Counter()
        self._queued: Counter[str] = Counter()  # tenant -> requests waiting
        self._weights: dict[str, float] = {}  # weights of the tenants with requests waiting
        self._known: set[tuple[int, str]] = set()
        self._drain = DrainRate()
        self.served = ServedTokens()
        # What the autoscaler's signals read (runtime/scaling/signals.py): outcomes by
        # reason (``dispatched`` and the DropReason values) and recent queue waits per band.
        self.outcomes: Counter[str] = Counter()
        self.waits: dict[int, deque[float]] = {}
        self._recent_waits = RecentWaits()  # all bands: the LoRA adapters' hold rule reads it
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.settings = settings
        policies = settings.policies()
        self._detector = policies.saturation
        self._headroom = self._headroom_rule(settings, policies)
        self._queue = settings.new_queue(policies)

    # -- configuration ------------------------------------------------------------------

    def _headroom_rule(self, settings: PoolSettings, policies: PoolPolicies) -> HeadroomRule:
        fraction = settings.headroom_for(isolating=policies.fairness.isolates_tenants)
        return HeadroomRule(fraction=fraction, window_s=self._headroom_window_s)

    def update(self, settings: PoolSettings) -> None:
        """New settings from a snapshot swap; queued requests and counters are kept."""
        if settings == self.settings:
            return
        policies = settings.policies()
        self._detector = policies.saturation
        headroom = self._headroom_rule(settings, policies)
        if headroom.fraction != self._headroom.fraction:
            self._headroom = headroom  # (else keep what it learned: weights, peaks)
        if settings.queue_key() != self.settings.queue_key():
            old, self._queue = self._queue, settings.new_queue(policies)
            for band, tenant in self._known:
                self._queue.lift_counter(band, tenant, old.counter(band, tenant))
            now = self._clock()
            for req in old.requests():
                try:
                    for shed in self._queue.push(req):
                        self._drop(shed, self._shed_error(), now)
                except QueueFull:
                    self._drop(req, self._shed_error(), now)
        self.settings = settings
        self._pump()

    # -- the request's side -------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._waiting)

    async def acquire(self, ticket: Ticket) -> Grant:
        """Queue ``ticket`` and wait for an endpoint; see the module docstring."""
        if self._closed:
            raise NoEndpointError(f"the pool '{self.pool}' is not serving")
        now = self._clock()
        if not self.placement.candidates(ticket.version, frozenset()):
            self._hold_or_refuse(ticket, now)
        if not self._waiting:
            direct = self._direct(ticket, now)
            if direct is not None:
                return direct
        self._pump(now)
        seq = next(self._seq)
        req = QueuedRequest(
            id=str(seq),
            tenant=ticket.tenant,
            band=ticket.band,
            class_name=ticket.class_name,
            input_tokens=ticket.input_tokens,
            max_output_tokens=ticket.max_output_tokens,
            seq=seq,
            arrived_at=now,
            deadline=ticket.deadline,
            weight=ticket.weight,
            shed_order=ticket.shed_order,
            is_shadow=ticket.is_shadow,
            over_quota=self._over_quota(ticket),
        )
        decision = admit(self._queue, self._drain, req, now=now)
        if isinstance(decision, Rejected):
            self.outcomes[str(decision.reason)] += 1
            raise QueueRejectedError(decision)
        for shed in decision.displaced:
            self._drop(shed, self._shed_error(), now)
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._waiting[req.id] = _Waiter(ticket, req, future)
        self._queued[ticket.tenant] += 1
        self._weights[ticket.tenant] = ticket.weight
        self._headroom.note(ticket.tenant, ticket.weight, now)
        self._pump(now)
        if not future.done():
            self.served.queued(ticket.tenant, ticket.weight, now)
            self._wake.set()
            if ticket.on_queued is not None:
                ticket.on_queued(functools.partial(self._position, req.id))
        try:
            return await future
        except asyncio.CancelledError:
            self._cancelled(req.id, future)
            raise

    def _position(self, req_id: str) -> int | None:
        """The 1-based queue position of a waiting request; None once it left the queue."""
        if req_id not in self._queue:
            return None
        return self._queue.position(req_id)

    def _hold_or_refuse(self, ticket: Ticket, now: float) -> None:
        """No usable endpoint: wait in the queue while a replica starts (scale from zero) if
        the deadline covers its start time; else :class:`NoEndpointError`."""
        start_s = self._cold_start(ticket.version) if self._cold_start is not None else None
        if start_s is None:
            raise NoEndpointError(f"no usable endpoint serves the pool '{self.pool}' version")
        if ticket.deadline - now < start_s:
            raise NoEndpointError(
                f"no replica of this version is ready and starting one takes about "
                f"{start_s:.1f} s, longer than the request's deadline allows",
                retry_after_s=max(1, math.ceil(start_s)),
            )

    def _direct(self, ticket: Ticket, now: float) -> Grant | None:
        """The fast path (module docstring) when it applies; None: take the queued path."""
        if not now < ticket.deadline:
            return None
        roomy = self._room_for(ticket, 0.0)
        if not roomy:
            return None
        self._headroom.note(ticket.tenant, ticket.weight, now)
        gate = self._headroom.gate(
            inflight=self._inflight,
            queued={ticket.tenant: 1},
            capacity=self.placement.capacity(),
            now=now,
        )
        if not self._lend and gate.blocks(ticket.tenant, self._inflight):
            return None
        seq = next(self._seq)
        req = QueuedRequest(
            id=str(seq),
            tenant=ticket.tenant,
            band=ticket.band,
            class_name=ticket.class_name,
            input_tokens=ticket.input_tokens,
            max_output_tokens=ticket.max_output_tokens,
            seq=seq,
            arrived_at=now,
            deadline=ticket.deadline,
            weight=ticket.weight,
            shed_order=ticket.shed_order,
            is_shadow=ticket.is_shadow,
            over_quota=False,
        )
        self._queue.pass_through(req)
        self._drain.observe(now=now, queued=0)
        self._charged(req, input_tokens=req.input_tokens, output_tokens=0, now=now)
        endpoint = self.placement.choose(
            roomy, ticket.affinity_key, adapter=ticket.adapter, prefix=ticket.prefix
        )
        self.placement.acquire(endpoint.id)
        self._inflight[req.tenant] += 1
        self._note_dispatched(req.band, 0.0)
        return Grant(self, ticket, req, endpoint, waited_s=0.0)

    def _note_dispatched(self, band: int, waited: float) -> None:
        """What the autoscaler's signals read: a dispatch and its queue wait, per band."""
        self.outcomes["dispatched"] += 1
        band_waits = self.waits.get(band)
        if band_waits is None:
            band_waits = self.waits[band] = deque(maxlen=256)
        band_waits.append(waited)
        self._recent_waits.add(waited)

    def _cancelled(self, req_id: str, future: asyncio.Future[Grant]) -> None:
        waiter = self._waiting.get(req_id)
        if waiter is not None and waiter.future is future:
            self._queue.remove(req_id)
            self._forget(waiter.req)
            self._drain.observe(now=self._clock(), queued=len(self._queue))
        elif future.done() and not future.cancelled() and future.exception() is None:
            future.result().release()

    def _over_quota(self, ticket: Ticket) -> bool:
        """The tenant already holds its weighted share of the pool queue's bound."""
        bound = self.settings.max_total or self.settings.default_limit
        if bound is None:
            return False
        mine = self._queued.get(ticket.tenant, 0)
        if mine == 0:
            return False
        others = sum(w for t, w in self._weights.items() if t != ticket.tenant)
        return mine >= bound * ticket.weight / (others + ticket.weight)

    def _shed_error(self) -> QueueDropError:
        wait = self._drain.estimated_wait(sum(s.cost for s in self._queue.stats().values()))
        return QueueDropError(
            DropReason.SHED,
            "shed from the queue under overload by a more important request",
            retry_after_s=retry_after_s(wait),
        )

    # -- grants -------------------------------------------------------------------------

    def release(self, grant: Grant) -> None:
        if grant.endpoint is not None:
            self.placement.release(grant.endpoint.id)
            grant.endpoint = None
        tenant = grant.ticket.tenant
        self._inflight[tenant] -= 1
        if self._inflight[tenant] <= 0:
            del self._inflight[tenant]
        self._pump()

    def reassign(self, grant: Grant, exclude: frozenset[int]) -> EndpointSnap | None:
        """Move ``grant`` to another endpoint (a retry before the first byte)."""
        if grant.endpoint is not None:
            self.placement.release(grant.endpoint.id)
            grant.endpoint = None
        ticket = grant.ticket
        roomy = self._roomy(ticket.version, exclude)
        if roomy:
            endpoint: EndpointSnap | None = self.placement.choose(
                roomy, ticket.affinity_key, adapter=ticket.adapter, prefix=ticket.prefix
            )
        else:
            endpoint = self.placement.fallback(
                ticket.version, exclude, ticket.affinity_key, prefix=ticket.prefix
            )
        if endpoint is not None:
            self.placement.acquire(endpoint.id)
            grant.endpoint = endpoint
        self._pump()
        return endpoint

    def charge_output(self, grant: Grant, tokens: int) -> None:
        """Charge ``tokens`` streamed output tokens of a dispatched request to its tenant."""
        if tokens <= 0:
            return
        req = grant.request
        self._queue.lift_counter(req.band, req.tenant, 0.0)  # make sure the band exists
        self._queue.charge_output(req, tokens)
        self._charged(req, input_tokens=0, output_tokens=tokens, now=self._clock())

    def charge_bypass(
        self, *, tenant: str, band: int, weight: float, input_tokens: int, output_tokens: int
    ) -> None:
        """Charge service answered without the queue (a cache hit, at its cheaper weight) to
        ``tenant``'s fairness counters, here and in the shared counters."""
        self._queue.charge(band, tenant, weight=weight, input_tokens=input_tokens,
                           output_tokens=output_tokens)  # fmt: skip
        self._account(tenant, band, weight, input_tokens, output_tokens, self._clock())

    def _charged(
        self, req: QueuedRequest, *, input_tokens: int, output_tokens: int, now: float
    ) -> None:
        self._account(req.tenant, req.band, req.weight, input_tokens, output_tokens, now)

    def _account(  # noqa: PLR0917 - private, positional by design
        self, tenant: str, band: int, weight: float, input_tokens: int, output_tokens: int,
        now: float,
    ) -> None:  # fmt: skip
        self._known.add((band, tenant))
        self.served.add(
            tenant,
            weight=weight,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            now=now,
        )
        if self._sink is not None:
            amount = token_cost(input_tokens, output_tokens) / weight
            self._sink.record(self.pool, band, tenant, amount)

    def lift(self, band: int, tenant: str, value: float) -> None:
        """Raise a fairness counter to the global value (shared counters' sync)."""
        self._known.add((band, tenant))
        self._queue.lift_counter(band, tenant, value)

    # -- the pump -----------------------------------------------------------------------

    def _roomy(self, version: int, exclude: frozenset[int]) -> list[EndpointSnap]:
        out: list[EndpointSnap] = []
        for endpoint in self.placement.candidates(version, exclude):
            inflight, load = self.placement.load(endpoint)
            if self._detector.has_room(inflight=inflight, capacity=endpoint.capacity, metrics=load):
                out.append(endpoint)
        return out

    def _room_for(self, ticket: Ticket, waited_s: float) -> list[EndpointSnap]:
        """The endpoints with room for ``ticket``; for a LoRA adapter, those the adapters'
        hold rule allows after ``waited_s`` in the queue (:meth:`Placement.adapter_room`)."""
        roomy = self._roomy(ticket.version, frozenset())
        if ticket.adapter is None or not roomy:
            return roomy
        return list(self.placement.adapter_room(
            ticket.version, roomy, ticket.adapter,
            waited_s=waited_s, typical_wait_s=self._recent_waits.quantile(),
        ))  # fmt: skip

    def _pump(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        for expired in self._queue.expire(now):
            self._drop(
                expired,
                QueueDropError(
                    DropReason.DEADLINE_EXPIRED,
                    "the request's deadline passed; dropped from the queue before dispatch",
                ),
                now,
            )
        if not self._waiting:
            return
        capacity = self.placement.capacity()
        for _ in range(len(self._waiting)):
            gate = self._headroom.gate(
                inflight=self._inflight, queued=self._queued, capacity=capacity, now=now
            )
            gated_full = bool(gate) and all(
                gate.blocks(t, self._inflight, lending=self._lend) for t in gate.tenants
            )
            rooms: dict[int | str, list[EndpointSnap]] = {}

            def has_room(req: QueuedRequest) -> bool:
                ticket = self._waiting[req.id].ticket
                if ticket.adapter is not None:  # its own room: the hold rule's, by its wait
                    rooms[req.id] = self._room_for(ticket, now - req.arrived_at)  # noqa: B023
                    return bool(rooms[req.id])  # noqa: B023
                if ticket.version not in rooms:  # noqa: B023
                    rooms[ticket.version] = self._roomy(ticket.version, frozenset())  # noqa: B023
                return bool(rooms[ticket.version])  # noqa: B023

            def under(req: QueuedRequest) -> bool:
                return req.tenant not in gate.tenants and has_room(req)  # noqa: B023

            # Tenants past their share yield to the others whatever the band: an over tenant's
            # interactive request goes after an under tenant's batch one (:mod:`.headroom`).
            req = self._queue.pop(under if gate else has_room)
            if req is None and gate and not gated_full:
                req = self._queue.pop(
                    lambda r: (
                        not gate.blocks(r.tenant, self._inflight, lending=self._lend)  # noqa: B023
                        and has_room(r)
                    )
                )
            if req is None and gate and self._lendable(capacity):  # taken back by preemption
                req = self._queue.pop(has_room)
            if req is None:
                return
            waiter = self._waiting[req.id]
            self._forget(req)
            self._drain.observe(now=now, queued=len(self._queue), dispatched_cost=req.cost)
            self._charged(req, input_tokens=req.input_tokens, output_tokens=0, now=now)
            if waiter.future.done():
                continue  # cancelled while we were about to release it
            ticket = waiter.ticket
            endpoint = self.placement.choose(
                rooms[req.id if ticket.adapter is not None else ticket.version],
                ticket.affinity_key,
                adapter=ticket.adapter,
                prefix=ticket.prefix,
            )
            self.placement.acquire(endpoint.id)
            self._inflight[req.tenant] += 1
            waited = max(now - req.arrived_at, 0.0)
            self._note_dispatched(req.band, waited)
            waiter.future.set_result(Grant(self, ticket, req, endpoint, waited_s=waited))

    def _lendable(self, capacity: int) -> bool:
        """Whether a slot may be lent now: lending is on and more than ``lend_reserve`` of
        the pool's ``capacity`` slots are free."""
        return self._lend and capacity - sum(self._inflight.values()) > self._lend_reserve

    def _forget(self, req: QueuedRequest) -> None:
        self._waiting.pop(req.id, None)
        self._queued[req.tenant] -= 1
        if self._queued[req.tenant] <= 0:
            del self._queued[req.tenant]
            self._weights.pop(req.tenant, None)

    def _drop(self, req: QueuedRequest, error: Exception, now: float) -> None:
        """``req`` left the queue without an endpoint: answer its waiter with ``error``."""
        waiter = self._waiting.get(req.id)
        if req.id in self._queue:
            self._queue.remove(req.id)
        if waiter is None:
            return
        self._forget(req)
        self._drain.observe(now=now, queued=len(self._queue))
        if isinstance(error, QueueDropError):
            self.outcomes[str(error.reason)] += 1
        if not waiter.future.done():
            waiter.future.set_exception(error)

    def _strand(self) -> None:
        """Requests whose version lost every usable endpoint get 503 at once."""
        versions = {w.ticket.version for w in self._waiting.values()}
        dead = {
            v
            for v in versions
            if not self.placement.candidates(v, frozenset())
            and (self._cold_start is None or self._cold_start(v) is None)
        }
        if not dead:
            return
        now = self._clock()
        for waiter in [w for w in self._waiting.values() if w.ticket.version in dead]:
            error = NoEndpointError("no usable endpoint is left for this version")
            self._drop(waiter.req, error, now)

    # -- lifecycle ----------------------------------------------------------------------

    def start(self) -> None:
        if self._task is None and not self._closed:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"dispatcher-{self.pool}"
            )

    async def stop(self, reason: str = "the router is shutting down") -> None:
        """Stop the loop; every waiting request gets :class:`NoEndpointError` (503)."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        now = self._clock()
        for waiter in list(self._waiting.values()):
            self._drop(waiter.req, NoEndpointError(reason), now)

    async def _run(self) -> None:
        while not self._closed:
            timeout: float | None = None
            if self._waiting:
                timeout = self._tick_s
                deadline = self._queue.next_deadline()
                if deadline is not None:
                    timeout = max(0.0, min(timeout, deadline - self._clock()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()
            try:
                self._strand()
                self._pump()
            except Exception:
                logger.exception("dispatcher of pool %s: pump failed", self.pool)

    # -- what metrics read --------------------------------------------------------------

    def queue_lengths(self) -> dict[int, int]:
        return self._queue.band_lengths()

    def contended(self) -> bool:
        return bool(self._waiting)

    def queue_wait_s(self, band: int) -> float:
        """How long the oldest request waiting in ``band`` or a more urgent one has waited
        (0 when none waits): the measured wait degradation reads (:mod:`runtime.degradation`).
        Waiters are kept in arrival order, so the scan stops at the first one of those bands."""
        for waiter in self._waiting.values():
            if waiter.req.band <= band:
                return max(0.0, self._clock() - waiter.req.arrived_at)
        return 0.0

    def counters(self) -> dict[tuple[int, str], float]:
        return {(b, t): self._queue.counter(b, t) for b, t in self._known}

    def inflight(self) -> dict[str, int]:
        return dict(self._inflight)

    def shares(self) -> dict[str, float]:
        """Each active tenant's share of the pool's slots now (:meth:`.HeadroomRule.shares`)."""
        return self._headroom.shares(
            inflight=self._inflight,
            queued=self._queued,
            capacity=self.placement.capacity(),
            now=self._clock(),
        )

    def held_back(self) -> Gate:
        """The headroom gate as of now: who is held back, and the limits (:mod:`.headroom`).

        Computing it is one more look for the rule's averages and peaks (as every dispatch
        is): harmless at any moment, since they integrate what was held between looks."""
        return self._headroom.gate(
            inflight=self._inflight,
            queued=self._queued,
            capacity=self.placement.capacity(),
            now=self._clock(),
        )
