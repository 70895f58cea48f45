"""Tenant limits and credit escrow held in Redis, global across router replicas.

Admission is one ``EVALSHA`` (one round trip): the script reads Redis's own clock, checks
RPM, TPM, concurrency (see :mod:`.limits` for their exact semantics), the hard budget caps and
the credit balance (see :mod:`.credits`) and, only if all pass, debits them all — atomically,
so two routers can never both take the last slot or the last credit.
Keys, per tenant (the ``{tenant}`` hash tag keeps them in one cluster slot)::

    {prefix}:{<tenant>}:rpm    sorted set: lease id -> admission time (ms)
    {prefix}:{<tenant>}:tpm    hash: tokens, ts (ms)
    {prefix}:{<tenant>}:conc   sorted set: lease id -> lease expiry (ms)
    {prefix}:{<tenant>}:credit / :escrow   see :mod:`runtime.contract`

Settlement (concurrency release, TPM correction, RPM give-back, the credit charge and the
usage event) is queued by :meth:`settle` without network I/O — it is written to the local
spool (:mod:`runtime.metering.spool`) — and sent by a background task, one settle script
call per batch (each settlement applied in turn as if alone: see ``SETTLE_LUA``); the script
appends each usage event to the stream in the same atomic step that charges the balance (the
usage stream is a second key outside the tenant's slot, and a batch spans tenants: one Redis,
not a cluster).
A batch waits at most ``settle_linger_s`` (default 250 ms) from its first settlement, or until
``_FLUSH_AT`` are queued, or until the allowance tick (every ``allowance_ttl_s / 4``) takes it
along, so one script call (and one spool rotation) carries many requests instead of one
each, at low rates too (issue #27: at 20 req/s a 20 ms linger sent each settlement alone,
the largest share of the router's CPU per request). What lingers is a settlement the router's
memory already applied (an allowance's slot and tokens are back at once; what goes to Redis is
its usage event): a settlement that frees a concurrency slot held in Redis (the exact path) is
sent at once, so a client at its concurrency limit never waits on the linger.
The same task renews the leases of this router's running requests every third of the lease
TTL, so only a crashed router's leases expire.

When Redis does not answer, admission falls back to :class:`~.limits.LocalLimits` and
:class:`~.credits.LocalCredits`, each limit and credit share divided by ``replicas`` — the
number of router *processes* that share the limits (routers x ``--workers``,
:attr:`runtime.gateway.config.RouterConfig.limit_processes`), so N workers of one router
together stay within the one router's share — logs once, and tries Redis again after
``retry_s``; a recovery is logged once too. The same count sizes the allowance grants (each <=
1/(4 x replicas) of the free headroom).

**The rule for entering the fallback (hysteresis)** is :mod:`.hysteresis`'s: one slow call is
not an outage (a connection error enters the fallback at once; a timeout only after
``fail_after`` (3) failures in a row or ``fail_for_s`` (1 s) of failures).

Until then, only the request whose call failed is decided by the local fallback; every other
request (and the background task) still asks Redis. Any answer from Redis ends the run and
the fallback. A request the local fallback refuses (its share of a limit or of the credits)
is asked of Redis once more before the refusal stands: first the settlements queued meanwhile
are written (on the fallback they wait, and Redis would still count the slots they free), then
the admission call (each bounded by ``timeout_s``; a failed write, shared by the requests
waiting on it, lets the refusal stand). If Redis answers, its verdict wins, so a tenant
within its global limits is not refused by a blip.

Settlements are spooled per process (:mod:`runtime.metering.spool`: a slot of its own, and the
slots of dead processes adopted at start and every ``adopt_every_s``), so a worker killed while
Redis is down loses nothing: whoever claims or adopts its slot replays it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runtime.admission.allowance import (
    GRANT_LUA,
    RETURN_LUA,
    Allowances,
)
from runtime.admission.credits import (
    NO_ASK,
    CreditAsk,
    CreditKind,
    CreditRefusedError,
    LocalCredits,
)
from runtime.admission.evalsha import evaluate, pipelined
from runtime.admission.hysteresis import Hysteresis, refused
from runtime.admission.limits import (
    WINDOW_S,
    Lease,
    LimitExceededError,
    LimitKind,
    LocalLimits,
    Quota,
    RateState,
    refusal,
    settle_refund,
)
from runtime.admission.scripts import ADMIT_LUA, RENEW_LUA, SETTLE_LUA
from runtime.admission.settle_calls import settle_calls
from runtime.contract import (
    LIMITS_PREFIX,
    NAMESPACE,
    credit_key,
    escrow_key,
    lane_tenant,
    limits_keys,
    period_fields,
    usage_stream,
)
from runtime.metering.spool import Spool
from runtime.redis_conn import async_client

logger = logging.getLogger(__name__)

_KINDS = {b"rpm": LimitKind.RPM, b"tpm": LimitKind.TPM, b"concurrency": LimitKind.CONCURRENCY}
_CREDIT_KINDS = {b"credits": CreditKind.CREDITS, b"budget": CreditKind.BUDGET}
_MAX_PENDING_SETTLES = 100_000
_FLUSH_AT = 256  # queued settlements that are sent without waiting out the linger


class Settlement(msgspec.Struct, frozen=True, array_like=True):
    """One queued settle call, as kept in memory and written to the spool."""

    tenant: str
    lease: str
    refund: int
    drop_rpm: bool
    cost_uc: int
    day: str
    month: str
    event: str  # the usage event JSON, "" for none


_SPOOL_ENCODER = msgspec.json.Encoder()
_SPOOL_DECODER = msgspec.json.Decoder(Settlement)


def _text(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


class RedisLimits:
    """See the module docstring. ``start()`` in the lifespan, ``stop()`` at shutdown."""

    def __init__(
        self,
        redis_url: str,
        *,
        prefix: str = LIMITS_PREFIX,
        usage_stream: str = usage_stream(NAMESPACE),
        spool_dir: Path | None = None,
        replicas: int = 2,
        lease_ttl_s: float = 30.0,
        timeout_s: float = 0.5,
        retry_s: float = 2.0,
        fail_after: int = 3,
        fail_for_s: float = 1.0,
        allowance_ttl_s: float | None = 1.0,
        settle_linger_s: float = 0.25,
        adopt_every_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not lease_ttl_s > 0:
            raise ValueError("lease_ttl_s must be > 0")
        if settle_linger_s < 0:
            raise ValueError("settle_linger_s must be >= 0")
        self._linger_s = settle_linger_s
        self._adopt_every_s = adopt_every_s
        self._redis_url = redis_url
        self._prefix = prefix
        self._stream = usage_stream
        self._lease_ms = int(lease_ttl_s * 1000)
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._health = Hysteresis(fail_after=fail_after, fail_for_s=fail_for_s, retry_s=retry_s,
                                  replicas=replicas, clock=clock)  # fmt: skip
        self._clock = clock
        self.local = LocalLimits(replicas=replicas, clock=clock)
        self.local_credits = LocalCredits(replicas=replicas)
        self._spool = None if spool_dir is None else Spool(spool_dir)
        self._segments: list[Path] = []  # spool segments whose settlements are not applied yet
        self._writes_in_flight = 0
        self._overlaps = 0  # writes started while another was in flight
        self._client: aioredis.Redis[bytes] | None = None
        self._admit: Any = None
        self._settle: Any = None
        self._renew: Any = None
        self._grant: Any = None
        self._return: Any = None
        # Pre-granted allowances (see :mod:`.allowance`); None: every request goes to Redis.
        self.allowances = (
            None if allowance_ttl_s is None else Allowances(ttl_s=allowance_ttl_s, clock=clock)
        )
        self._share = 4 * replicas
        self._period = ("", "")  # the budget fields of the UTC day until _period_until
        self._period_until = -math.inf
        self._active: dict[str, Lease] = {}
        self._settles: list[Settlement] = []
        self._settles_due = math.inf  # when the queued batch must be sent
        self._wake = asyncio.Event()
        self._flushed: list[asyncio.Future[None]] = []  # waiting for the queued batch's write
        self._writing: asyncio.Future[bool] | None = None  # the write in flight: answered?
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def degraded(self) -> bool:
        """True while admission uses the local fallback."""
        return self._health.down

    def keys(self, tenant: str) -> list[str]:
        return [
            *limits_keys(self._prefix, tenant),
            credit_key(self._prefix, lane_tenant(tenant)),  # a batch lane spends its tenant's
            escrow_key(self._prefix, lane_tenant(tenant)),
        ]

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("RedisLimits already started")
        self._client = async_client(
            self._redis_url, name="switchyard-limits", timeout_s=self._timeout_s
        )
        self._admit = self._client.register_script(ADMIT_LUA)
        self._settle = self._client.register_script(SETTLE_LUA)
        self._renew = self._client.register_script(RENEW_LUA)
        self._grant = self._client.register_script(GRANT_LUA)
        self._return = self._client.register_script(RETURN_LUA)
        if self._spool is not None:
            self._spool.open()
            self._replay(self._spool.pending())
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="limits-settler")

    def _replay(self, entries: list[tuple[Path, list[bytes]]]) -> None:
        """Queue what an earlier run (or a dead process's slot, adopted) left in the spool
        (applied once: see SETTLE_LUA)."""
        replayed = 0
        for path, lines in entries:
            for line in lines:
                try:
                    self._settles.append(_SPOOL_DECODER.decode(line))
                    replayed += 1
                except msgspec.DecodeError:
                    logger.warning("limits: skipping a torn spool line in %s", path)
            self._segments.append(path)
        if replayed:
            self._settles_due = -math.inf  # sent by the task's first round
            logger.warning("limits: replaying %d settlements from the spool", replayed)

    async def stop(self) -> None:
        """Stop the background task after one last settlement flush; close the client."""
        self._stopping = True
        self._wake.set()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()  # type: ignore[attr-defined]
        if self._spool is not None:
            self._spool.close()

    # -- the request path -----------------------------------------------------------------

    async def acquire(
        self, tenant: str, quota: Quota, *, tokens: int, ask: CreditAsk = NO_ASK
    ) -> Lease:
        """Admit one request of ``tokens`` (prompt + max_tokens) whose worst case costs
        ``ask.need_uc``, or raise :class:`~.limits.LimitExceededError` /
        :class:`~.credits.CreditRefusedError`."""
        if self.allowances is not None and ask.need_uc <= 0 and tenant == lane_tenant(tenant):
            # escrow is not leased; a batch lane is always asked of Redis
            taken = self.allowances.take(tenant, quota, tokens)
            if self.allowances.wants:
                self._wake.set()
            if taken is not None:
                return taken
        if self._admit is None:
            return self._acquire_local(uuid.uuid4().hex, tenant, quota, tokens, ask)
        if self._health.may_ask():
            lease = await self._acquire_redis(tenant, quota, tokens, ask)
            if lease is not None:
                return lease
        try:
            return self._acquire_local(uuid.uuid4().hex, tenant, quota, tokens, ask)
        except (LimitExceededError, CreditRefusedError):
            # refused by the fallback's share only: Redis decides if it answers (once), told
            # first of the slots freed meanwhile (their settlements are queued while it is down)
            lease = None
            if await self._settled_in_redis():
                lease = await self._acquire_redis(tenant, quota, tokens, ask)
            if lease is None:
                raise
            return lease

    async def _settled_in_redis(self) -> bool:
        """Write every settlement queued so far, even on the fallback (after the write in
        flight, if any, whose failure is shared rather than repeated): False when Redis did
        not answer."""
        while self._writing is not None:
            if not await asyncio.shield(self._writing):
                return False
        return not self._settles or await self._write() > 0

    async def _acquire_redis(
        self, tenant: str, quota: Quota, tokens: int, ask: CreditAsk
    ) -> Lease | None:
        """One admission call: the lease, Redis's refusal raised, or None when Redis did not
        answer (a failure counted towards the fallback). A call that timed out may have run:
        its concurrency slot, RPM entry and escrow are released (queued; a no-op if it did
        not run); its TPM debit, if any, stays (the safe side)."""
        lease_id = uuid.uuid4().hex
        args = [lease_id, quota.rpm, quota.tpm, quota.concurrency, tokens, self._lease_ms,
                int(WINDOW_S * 1000), *ask.args]  # fmt: skip
        started = self._clock()
        try:
            answer = await self._admit(keys=self.keys(tenant), args=args)
        except (RedisError, OSError) as exc:
            self._health.failed(exc, started)
            if not refused(exc):
                self._queue(Settlement(tenant, lease_id, 0, True, 0, "", "", ""), urgent=True)
            return None
        self._health.answered()
        status, retry_ms, detail, available, room, hold, used, tokens_left, reset_ms = answer
        status = _text(status)
        rates = RateState.of(quota, used=int(used), tokens=float(tokens_left),
                             requests_reset_s=int(reset_ms) / 1000.0)  # fmt: skip
        if ask.need_uc > 0:
            self.local_credits.learn(lane_tenant(tenant), int(available), int(room))
        kind = _KINDS.get(status)
        if kind is not None:
            raise refusal(kind, int(retry_ms) / 1000.0, quota, float(detail), rates)
        credit_kind = _CREDIT_KINDS.get(status)
        if credit_kind is not None:
            short = int(room) if credit_kind is CreditKind.BUDGET else int(available)
            raise CreditRefusedError(credit_kind, needed_uc=ask.need_uc, available_uc=short)
        lease = Lease(id=lease_id, tenant=tenant, quota=quota, tokens=tokens, source="redis",
                      ask=ask, hold_uc=int(hold), overdraft=status == b"overdraft",
                      rates=rates)  # fmt: skip
        self._active[lease_id] = lease
        return lease

    def _acquire_local(
        self, lease_id: str, tenant: str, quota: Quota, tokens: int, ask: CreditAsk
    ) -> Lease:
        owner = lane_tenant(tenant)
        hold, overdraft = self.local_credits.hold(owner, ask)  # may refuse: before limits
        try:
            lease = self.local.acquire(lease_id, tenant, quota, tokens=tokens)
        except LimitExceededError:
            self.local_credits.unhold(owner, hold)
            raise
        lease.ask, lease.hold_uc, lease.overdraft = ask, hold, overdraft
        return lease

    def settle(
        self,
        lease: Lease,
        *,
        actual_tokens: int | None,
        served: bool,
        cost_uc: int = 0,
        event: bytes = b"",
    ) -> None:
        """The request ended (no network I/O here). ``served``: it reached an engine;
        ``actual_tokens``: prompt + completion tokens from its usage, if known; ``cost_uc``:
        what its tokens cost (charged, released escrow aside); ``event``: its usage event."""
        if lease.settled:
            return
        lease.settled = True
        drop = not served
        if lease.source == "allowance":
            assert self.allowances is not None
            refund = settle_refund(lease, actual_tokens=actual_tokens, served=served)
            refund, release = self.allowances.put_back(lease, refund)
            if release:  # its allowance was given back meanwhile: free the slot in Redis
                self._queue(
                    Settlement(lease.tenant, lease.slot, 0, False, 0, "", "", ""), urgent=True
                )
            if served and refund == 0 and cost_uc <= 0 and not event:
                return  # memory only
        elif lease.source == "local":
            self.local.settle(lease, actual_tokens=actual_tokens, served=served)
            refund, drop = 0, False  # its limits were local: only the credits go to Redis
            if cost_uc <= 0 and not event:
                return
        else:
            self._active.pop(lease.id, None)
            refund = settle_refund(lease, actual_tokens=actual_tokens, served=served)
        day, month = self._period_fields()
        self._queue(Settlement(tenant=lease.tenant, lease=lease.id, refund=refund,
                               drop_rpm=drop, cost_uc=max(0, cost_uc), day=day, month=month,
                               event=event.decode()),
                    urgent=lease.source == "redis")  # fmt: skip

    def _period_fields(self) -> tuple[str, str]:
        """:func:`~runtime.contract.period_fields` of now, computed once per UTC day (a unix
        day is 86,400 s; a month ends at a day's end)."""
        now = time.time()
        if now >= self._period_until:
            self._period = period_fields(now)
            self._period_until = (now // 86_400 + 1) * 86_400
        return self._period

    def _queue(self, item: Settlement, *, urgent: bool = False) -> None:
        """Spool ``item`` and queue it for the next batch: sent once the batch's linger is
        over, at once when ``urgent`` (it frees a concurrency slot held in Redis) or when
        the batch is full."""
        if self._spool is not None:
            self._spool.append(_SPOOL_ENCODER.encode(item))
        if len(self._settles) < _MAX_PENDING_SETTLES:  # beyond: the spool still has it
            self._settles.append(item)
        if urgent or len(self._settles) >= _FLUSH_AT:
            self._settles_due = -math.inf
            self._wake.set()
        elif self._settles_due == math.inf:  # the batch's first: the task arms its timer
            self._settles_due = self._clock() + self._linger_s
            self._wake.set()

    async def slots_freed(self) -> None:
        """Wait until the queued settlements that free a Redis concurrency slot are written
        (at once when none is queued, or Redis is down: the local fallback decides then). The
        gateway awaits this before a response's last byte, so a client that sees its response
        end finds its slot free (issue #27)."""
        waiter = self.slot_writes()
        if waiter is not None:
            await waiter

    def slot_writes(self) -> asyncio.Future[None] | None:
        """:meth:`slots_freed`'s wait, or None when there is nothing to wait for (the common
        case on the memory path: the caller then sets up no wait at all)."""
        urgent = self._settles and self._settles_due == -math.inf
        if not urgent or self._task is None or self._health.down or self._stopping:
            return None
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._flushed.append(waiter)
        return waiter

    def _wake_flushed(self, waiters: list[asyncio.Future[None]]) -> None:
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- background -----------------------------------------------------------------------

    async def _run(self) -> None:
        renew_every = self._lease_ms / 3000.0
        next_renew = self._clock() + renew_every
        tick = math.inf if self.allowances is None else self.allowances.ttl_s / 4.0
        next_tick = self._clock() + tick
        adopt_every = math.inf if self._spool is None else self._adopt_every_s
        next_adopt = self._clock() + adopt_every
        while not self._stopping:
            wake_at = min(next_renew, next_tick, next_adopt)
            if self._settles:  # the batch's linger; while Redis is down, the retry interval
                due = self._clock() + self._retry_s if self._health.down else self._settles_due
                wake_at = min(wake_at, due)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(max(0.0, wake_at - self._clock())):
                    await self._wake.wait()
            self._wake.clear()
            ticked = self._clock() >= next_tick
            if self._settles and (
                self._health.down or ticked or self._clock() >= self._settles_due
            ):  # the tick takes a lingering batch along: one wake-up, not two
                await self.flush()
            if self.allowances is not None and (self.allowances.wants or ticked):
                # grants asked for, entries past validity, idle tenants (see .allowance)
                await self.allowance_round()
                next_tick = self._clock() + tick
            if self._clock() >= next_renew:
                await self.renew()
                next_renew = self._clock() + renew_every
            if self._spool is not None and self._clock() >= next_adopt:
                self._replay(self._spool.adopt())  # the slots of dead processes
                next_adopt = self._clock() + adopt_every
        if self.allowances is not None:
            await self.allowance_round(everything=True)
        await self.flush()

    async def flush(self) -> int:
        """Write the queued settlements (see :meth:`_write`); returns how many were written."""
        if not self._health.may_ask():
            self._wake_flushed(self._flushed)
            self._flushed = []
            return 0
        return max(0, await self._write())

    async def _write(self) -> int:
        """Write the queued settlements in one settle script call (a replay of many: a few,
        in one pipeline): how many, -1 when Redis did not answer (they stay queued)."""
        if not self._settles or self._client is None:
            self._wake_flushed(self._flushed)
            self._flushed = []
            return 0
        writing = self._writing = asyncio.get_running_loop().create_future()
        batch, self._settles = self._settles, []
        waiters, self._flushed = self._flushed, []
        self._settles_due = math.inf
        # what the spool holds of this batch: the current file up to its mark and the
        # segments so far (see runtime.metering.spool); cleaned up once applied, unless another
        # write overlapped this one (its batch, in those files too, may not be applied)
        mark = 0 if self._spool is None else self._spool.mark()
        segments = list(self._segments)
        alone = self._writes_in_flight == 0
        self._writes_in_flight += 1
        self._overlaps += not alone
        overlaps = self._overlaps
        calls = settle_calls(batch, self.keys, self._stream, self._prefix)
        started = self._clock()
        written = False
        try:
            await pipelined(self._client, self._settle, SETTLE_LUA, calls)
            written = True
        except (RedisError, OSError) as exc:
            self._health.failed(exc, started)
            self._settles = batch + self._settles
            self._settles_due = -math.inf  # retried once Redis answers again
            return -1
        finally:
            self._writes_in_flight -= 1
            self._writing = None
            writing.set_result(written)
            self._wake_flushed(waiters)
        self._health.answered()
        if self._spool is not None and alone and overlaps == self._overlaps:
            for segment in segments:  # every settlement they hold is applied now
                self._spool.discard(segment)
            del self._segments[: len(segments)]  # those replayed meanwhile stay
            rotated = self._spool.applied(mark)
            if rotated is not None:
                self._segments.append(rotated)
        return len(batch)

    async def renew(self) -> int:
        """Push the lease expiry of this router's running requests (one pipeline)."""
        if self._client is None or not (self._active or self.allowances is not None):
            return 0
        by_tenant = {} if self.allowances is None else self.allowances.slots()
        for lease in self._active.values():
            by_tenant.setdefault(lease.tenant, []).append(lease.id)
        calls = [
            ([self.keys(tenant)[2]], [self._lease_ms, *ids]) for tenant, ids in by_tenant.items()
        ]
        if not calls:
            return 0
        started = self._clock()
        try:
            await pipelined(self._client, self._renew, RENEW_LUA, calls)
        except (RedisError, OSError) as exc:
            self._health.failed(exc, started)
            return 0
        self._health.answered()
        return len(self._active)

    async def allowance_round(self, *, everything: bool = False) -> None:
        """One pipeline: the grants asked for and the unused allowance given back."""
        assert self.allowances is not None
        asks = [] if everything else self.allowances.asks()
        gives = self.allowances.expire(everything=everything)
        if (not asks and not gives) or self._client is None or not self._health.may_ask():
            for ask in asks:
                self.allowances.failed(ask)
            return
        window_ms = int(WINDOW_S * 1000)
        ttl_ms = int(self.allowances.ttl_s * 1000)
        calls: list[tuple[Any, str, list[str], list[Any]]] = [
            (self._grant, GRANT_LUA, self.keys(a.tenant)[:3],
             a.args(ttl_ms=ttl_ms, lease_ms=self._lease_ms, window_ms=window_ms,
                    share=self._share))
            for a in asks
        ]  # fmt: skip
        calls += [(self._return, RETURN_LUA, self.keys(g.tenant)[:3], g.args()) for g in gives]
        started = self._clock()
        try:
            answers = await evaluate(self._client, calls)
        except (RedisError, OSError) as exc:
            self._health.failed(exc, started)
            for ask in asks:  # what was granted meanwhile, if anything, expires on its own
                self.allowances.failed(ask)
            return
        self._health.answered()
        for ask, answer in zip(asks, answers, strict=False):
            requests, tokens, slots, used, bucket = (int(x) for x in answer)
            self.allowances.granted(ask, requests, tokens, slots, used=used, bucket=bucket)
