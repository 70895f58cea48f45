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
   picker), take the slot and resolve the waiter;
3. with a ``preemption`` policy, when a request of a tenant the gate lets through still
   waits with no room: stop a stream holding a lent slot and give the slot to it
   (:mod:`.takeback`; the stopped one waits again, parked, and resumes by continuation).
   A lent slot's prefill may be paced (``pace_prefill_tps``, :mod:`.pacing`).

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
from collections import Counter, deque
from collections.abc import Callable, Sequence

from runtime.routing.adapters import RecentWaits
from runtime.scheduling.admission import Rejected, admit
from runtime.scheduling.charges import Charges
from runtime.scheduling.coldstart import ColdStart, hold_or_refuse, stranded
from runtime.scheduling.drain import DrainRate, retry_after_s
from runtime.scheduling.grant import (
    Grant,
    NoEndpointError,
    Preemptee,
    QueueDropError,
    QueueRejectedError,
    Ticket,
    Waiter,
)
from runtime.scheduling.headroom import Gate, HeadroomRule
from runtime.scheduling.holdings import Holdings
from runtime.scheduling.interfaces import DropReason, QueuedRequest
from runtime.scheduling.pacing import PacedRoom, PrefillPacer
from runtime.scheduling.ports import CounterSink, Placement
from runtime.scheduling.queue import QueueFull
from runtime.scheduling.registry import PoolPolicies
from runtime.scheduling.rooms import Rooms, room_for
from runtime.scheduling.rooms import roomy as rooms_roomy
from runtime.scheduling.settings import PoolSettings
from runtime.scheduling.takeback import TakeBack
from runtime.snapshot import EndpointSnap

logger = logging.getLogger(__name__)

__all__ = ["CounterSink", "Grant", "NoEndpointError", "Placement", "PoolDispatcher",
           "QueueDropError", "QueueRejectedError", "Ticket"]  # fmt: skip
_EXPIRED = "the request's deadline passed; dropped from the queue before dispatch"


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
        cold_start: ColdStart | None = None,
        lend: bool | None = None,
        lend_reserve: int | None = None,
    ) -> None:
        if not tick_s > 0:
            raise ValueError(f"tick_s must be > 0, got {tick_s!r}")
        self.pool = pool
        self.placement = placement
        self._clock = clock
        self._tick_s = tick_s
        self._headroom_window_s = headroom_window_s
        self._cold_start = cold_start  # scale from zero: version -> a replica's start seconds
        self._seq = itertools.count(1)
        self._waiting: dict[str, Waiter] = {}
        self._drain = DrainRate()
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
        # Lend: what the headroom gate would hold back may take a slot nobody else waits for,
        # taken back by preemption when a tenant the gate lets through arrives (:mod:`.takeback`);
        # on with a ``preemption`` policy (``lend`` overrides), only while more than
        # ``lend_reserve`` slots are free (the others' next arrivals then need no preemption).
        self._lend_override = (lend, lend_reserve)
        self._takeback = TakeBack(policies.preemption, resume_first=settings.resume_first,
                                  resume_home=settings.resume_home())  # fmt: skip
        self._held = Holdings(self._headroom_rule(settings, policies),
                              lend=self._takeback.armed if lend is None else lend,
                              lend_reserve=settings.lend_reserve if lend_reserve is None
                              else lend_reserve)  # fmt: skip
        self._queue = settings.new_queue(policies)
        self._charges = Charges(pool, self._queue, sink)
        self.served = self._charges.served
        self._pacer = PrefillPacer(settings.pace_prefill_tps, exclusive=settings.lend_exclusive)
        self._lending = settings.lent_prefill()  # which lent prompts, where (:mod:`.lent_prefill`)

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
        if headroom.fraction != self._held.rule.fraction:
            self._held.rule = headroom  # (else keep what it learned: weights, peaks)
        self._takeback.policy = policies.preemption
        self._pacer.prefill_tps, self._takeback.resume_first = (settings.pace_prefill_tps,
                                                                settings.resume_first)  # fmt: skip
        self._pacer.exclusive, self._lending = settings.lend_exclusive, settings.lent_prefill()
        self._takeback.homes.rule = settings.resume_home()
        lend, reserve = self._lend_override
        self._held.lend = self._takeback.armed if lend is None else lend
        self._held.lend_reserve = settings.lend_reserve if reserve is None else reserve
        if settings.queue_key() != self.settings.queue_key():
            old, self._queue = self._queue, settings.new_queue(policies)
            self._charges.move(self._queue)
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
        candidates = self.placement.candidates(ticket.version, frozenset())
        if not candidates:
            hold_or_refuse(self._cold_start, self.pool, ticket, now)
        elif not self._waiting:
            direct = self._direct(ticket, now, candidates)
            if direct is not None:
                return direct
        self._pump(now)
        req = self._request(ticket, now, over_quota=self._over_quota(ticket))
        decision = admit(self._queue, self._drain, req, now=now)
        if isinstance(decision, Rejected):
            self.outcomes[str(decision.reason)] += 1
            raise QueueRejectedError(decision)
        for shed in decision.displaced:
            self._drop(shed, self._shed_error(), now)
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        self._waiting[req.id] = Waiter(ticket, req, future)
        self._held.waits(ticket.tenant, ticket.weight)
        self._held.note(ticket.tenant, ticket.weight, now)
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

    def _request(self, ticket: Ticket, now: float, *, over_quota: bool) -> QueuedRequest:
        seq = next(self._seq)
        return QueuedRequest(
            id=str(seq), tenant=ticket.tenant, band=ticket.band, class_name=ticket.class_name,
            input_tokens=ticket.input_tokens, max_output_tokens=ticket.max_output_tokens,
            seq=seq, arrived_at=now, deadline=ticket.deadline, weight=ticket.weight,
            shed_order=ticket.shed_order, is_shadow=ticket.is_shadow, over_quota=over_quota,
        )  # fmt: skip

    def _ticket_of(self, req_id: str) -> Ticket:
        return self._waiting[req_id].ticket

    def _prefill_of(self, req: QueuedRequest) -> int:
        """Its estimated prefill as the lent prompts' bound reads it: a resume's none."""
        return 0 if self._waiting[req.id].grant is not None else self._waiting[req.id].prefill

    def _position(self, req_id: str) -> int | None:
        """The 1-based queue position of a waiting request; None once it left the queue."""
        if req_id not in self._queue:
            return None
        return self._queue.position(req_id)

    def _direct(
        self, ticket: Ticket, now: float, candidates: Sequence[EndpointSnap]
    ) -> Grant | None:
        """The fast path (module docstring) when it applies; None: take the queued path.
        ``candidates``: the version's, as ``acquire`` just looked them up (once)."""
        if not now < ticket.deadline:
            return None
        roomy = room_for(self.placement, self._detector, ticket, waited_s=0.0,
                         waits=self._recent_waits, candidates=candidates)  # fmt: skip
        if not roomy:
            return None
        self._held.note(ticket.tenant, ticket.weight, now)
        capacity = self.placement.capacity()
        gate = self._held.gate(capacity, now, arriving=ticket.tenant)
        lent = self._held.blocks(gate, ticket.tenant)  # if anything: paced (:mod:`.pacing`)
        if lent and not (self._held.lendable(capacity) and self._lending.fits(ticket.prefill)
                         and self._pacer.allowed(roomy, now)):  # fmt: skip
            return None
        roomy = (self._pacer.allowed(roomy, now) if lent
                 else self._lending.steered(self._pacer, roomy, now))  # fmt: skip
        req = self._request(ticket, now, over_quota=False)
        self._queue.pass_through(req)
        self._drain.observe(now=now, queued=0)
        self._charges.dispatched(req, now)
        endpoint = self.placement.choose(
            roomy, ticket.affinity_key, adapter=ticket.adapter, prefix=ticket.prefix
        )
        self.placement.acquire(endpoint.id)
        self._pacer.sent(endpoint.id, ticket.prefill, now, lent=lent)
        self._held.took(req.tenant)
        self._note_dispatched(req.band, 0.0)
        return Grant(self, ticket, req, endpoint, waited_s=0.0, started_at=now)

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
        bound = self.settings.max_total or self.settings.default_limit
        return self._held.over_quota(ticket.tenant, ticket.weight, bound)

    def _shed_error(self) -> QueueDropError:
        wait = self._drain.estimated_wait(sum(s.cost for s in self._queue.stats().values()))
        return QueueDropError(
            DropReason.SHED,
            "shed from the queue under overload by a more important request",
            retry_after_s=retry_after_s(wait),
        )

    # -- grants -------------------------------------------------------------------------

    @property
    def takes_back(self) -> bool:
        """Whether this pool lends slots and takes them back by preemption."""
        return self._held.lend and self._takeback.armed

    def offer(self, grant: Grant, preemptee: Preemptee) -> None:
        """``grant``'s running stream may be preempted (:mod:`.takeback`)."""
        if self.takes_back and not grant.parked:
            self._takeback.offer(grant, preemptee)

    def release(self, grant: Grant) -> None:
        self._takeback.withdraw(grant)
        if grant.parked:  # preempted: no slot held; out of the queue if still in it
            grant.parked = False
            self._unpark(grant)
            self._pump()
            return
        if grant.endpoint is not None:
            self.placement.release(grant.endpoint.id)
            grant.endpoint = None
        self._held.gave(grant.ticket.tenant)
        self._pump()

    def reassign(self, grant: Grant, exclude: frozenset[int]) -> EndpointSnap | None:
        """Move ``grant`` to another endpoint (a retry before the first byte)."""
        if grant.endpoint is not None:
            self.placement.release(grant.endpoint.id)
            grant.endpoint = None
        ticket = grant.ticket
        roomy = rooms_roomy(self.placement, self._detector, ticket.version, exclude)
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
        if tokens > 0:
            self._charges.output(grant.request, tokens, self._clock())

    def charge_bypass(
        self, *, tenant: str, band: int, weight: float, input_tokens: int, output_tokens: int
    ) -> None:
        """Charge service answered without the queue (a cache hit, at its cheaper weight) to
        ``tenant``'s fairness counters, here and in the shared counters."""
        self._charges.bypass(tenant, band, weight, input_tokens, output_tokens, self._clock())

    def lift(self, band: int, tenant: str, value: float) -> None:
        """Raise a fairness counter to the global value (shared counters' sync)."""
        self._charges.lift(band, tenant, value)

    # -- the pump -----------------------------------------------------------------------

    def _pump(self, now: float | None = None) -> None:
        now = self._clock() if now is None else now
        for expired in self._queue.expire(now):
            self._drop(expired, QueueDropError(DropReason.DEADLINE_EXPIRED, _EXPIRED), now)
        if not self._waiting:
            return
        capacity = self.placement.capacity()
        held = self._held
        for _ in range(len(self._waiting)):
            gate = held.gate(capacity, now)
            gated_full = held.all_blocked(gate)
            rooms = Rooms(self.placement, self._detector, self._ticket_of, self._recent_waits, now,
                          homes=self._takeback.homes)  # fmt: skip
            has_room = rooms.has_room

            def under(req: QueuedRequest) -> bool:
                return req.tenant not in gate.tenants and has_room(req)  # noqa: B023

            # Tenants past their share yield to the others whatever the band: an over tenant's
            # interactive request goes after an under tenant's batch one (:mod:`.headroom`).
            req = self._queue.pop(under if gate else has_room)
            if req is None and gate and not gated_full:
                req = self._queue.pop(
                    lambda r: not held.blocks(gate, r.tenant) and has_room(r)  # noqa: B023
                )
            lent = PacedRoom(self._pacer, has_room, rooms.of, gate.tenants, now,
                             rule=self._lending, prefill_of=self._prefill_of)  # fmt: skip
            if req is None and gate and held.lendable(capacity):  # taken back by preemption
                req = self._queue.pop(lent, deep=lent.deep)  # paced by prefill (:mod:`.pacing`)
            if req is not None:
                self._send(req, now, lent.of(req), lent=lent.lent(req))
            elif not (gate and self._takeback.armed and self._take_back(gate, capacity, now)):
                return

    def _send(self, req: QueuedRequest, now: float, to: list[EndpointSnap] | EndpointSnap, *,
              lent: bool = False) -> None:  # fmt: skip
        """Dispatch ``req``, just popped, to ``to`` (or the choice among them; ``lent``: on a
        lent slot): a new grant, or the parked grant of a preempted request (no second
        admission, no second charge)."""
        waiter = self._waiting[req.id]
        prefill, home = waiter.prefill, self._forget(req)  # home: a resume's (affinity), or None
        self._drain.observe(now=now, queued=len(self._queue), dispatched_cost=req.cost)
        self._charges.dispatched(req, now)
        if waiter.future.done():
            return  # cancelled while we were about to release it
        ticket = waiter.ticket
        endpoint = to if isinstance(to, EndpointSnap) else self.placement.choose(
            to, ticket.affinity_key, adapter=ticket.adapter, prefix=ticket.prefix
        )  # fmt: skip
        self.placement.acquire(endpoint.id)
        self._pacer.sent(endpoint.id, 0 if endpoint.id == home else prefill, now, lent=lent)
        self._held.took(req.tenant)
        if waiter.grant is not None:  # a preempted request resumes
            waiter.grant.endpoint, waiter.grant.parked = endpoint, False
            waiter.future.set_result(waiter.grant)
            return
        waited = max(now - req.arrived_at, 0.0)
        self._note_dispatched(req.band, waited)
        waiter.future.set_result(
            Grant(self, waiter.ticket, req, endpoint, waited_s=waited, started_at=now)
        )

    # -- taking lent slots back (:mod:`.takeback`) ----------------------------------------

    def _take_back(self, gate: Gate, capacity: int, now: float) -> bool:
        """A request the gate lets through waits and its version has no room: stop the
        victim policy's running stream on one of its endpoints and give its slot to it."""
        held, victims = self._held, {}
        shares = held.shares(capacity, now)

        def victim_for(req: QueuedRequest) -> bool:
            waiter = self._waiting[req.id]
            if waiter.grant is not None or held.blocks(gate, req.tenant):
                return False  # a preempted request never preempts; a gated one waits
            ids = {e.id for e in self.placement.candidates(waiter.ticket.version, frozenset())}
            victim = self._takeback.victim(req.tenant, ids, gate, held.inflight, shares)
            if victim is None or not self._queue.has_room_for(
                self._takeback.requeued(victim.request).band
            ):
                return False
            victims[req.id] = victim
            return True

        req = self._queue.pop(victim_for)
        if req is None:
            return False
        victim = victims[req.id]
        endpoint = victim.endpoint
        assert endpoint is not None  # victim() offers only grants holding one
        self._preempt(victim, now)
        self._send(req, now, endpoint)
        return True

    def _preempt(self, grant: Grant, now: float) -> None:
        """Stop ``grant``'s stream, free its slot and queue its request again: the same id,
        place and deadline, its input tokens already charged."""
        preemptee = self._takeback.withdraw(grant)
        if grant.endpoint is not None:
            self._takeback.homes.left(grant.request.id, grant.endpoint.id, now)
            self.placement.release(grant.endpoint.id)
            grant.endpoint = None
        self._held.gave(grant.ticket.tenant)
        grant.parked = True
        grant.preemptions += 1
        req = self._takeback.requeued(grant.request)
        future: asyncio.Future[Grant] = asyncio.get_running_loop().create_future()
        grant.resume = future
        self._waiting[req.id] = Waiter(grant.ticket, req, future, grant)
        self._queue.push(req)
        self._held.waits(req.tenant, req.weight)
        self._drain.observe(now=now, queued=len(self._queue))
        self.outcomes["preempted"] += 1
        if preemptee is not None:
            preemptee.preempt()

    def _unpark(self, grant: Grant) -> None:
        """A parked grant ends: its request leaves the queue; a drop's error is retrieved."""
        waiter = self._waiting.get(grant.request.id)
        if waiter is not None and waiter.grant is grant:
            self._queue.remove(grant.request.id)
            self._forget(waiter.req)
            self._drain.observe(now=self._clock(), queued=len(self._queue))
            waiter.future.cancel()
        future = grant.resume
        if future is not None and future.done() and not future.cancelled():
            future.exception()  # (seen: no "never retrieved" warning)

    def _forget(self, req: QueuedRequest) -> int | None:
        self._waiting.pop(req.id, None)
        self._held.left(req.tenant)
        return self._takeback.homes.forget(req.id)  # its home, when a resume

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
        versions = (w.ticket.version for w in self._waiting.values())
        dead = stranded(self.placement, self._cold_start, versions)
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
                for at in (self._queue.next_deadline(), self._pacer.next_clear(self._clock())):
                    if at is not None:
                        timeout = max(0.0, min(timeout, at - self._clock()))
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
        return self._charges.counters()

    def inflight(self) -> dict[str, int]:
        return dict(self._held.inflight)

    def shares(self) -> dict[str, float]:
        """Each active tenant's share of the pool's slots now (:meth:`.HeadroomRule.shares`)."""
        return self._held.shares(self.placement.capacity(), self._clock())

    def poke(self) -> float | None:
        """Pump now (a virtual clock moved); when a paced lent slot may go next (:mod:`.pacing`)."""
        self._pump()
        return self._pacer.next_clear(self._clock()) if self._waiting else None

    def held_back(self) -> Gate:
        """The headroom gate as of now: who is held back, and the limits (:mod:`.headroom`);
        one more look for the rule's averages and peaks, harmless at any moment."""
        return self._held.gate(self.placement.capacity(), self._clock())
