"""Tenant limits held in Redis, global across router replicas.

Admission is one ``EVALSHA`` (one round trip): the script reads Redis's own clock, checks
RPM, TPM and concurrency (see :mod:`.limits` for their exact semantics) and, only if all
three pass, debits all three — atomically, so two routers can never both take the last slot.
Keys, per tenant (the ``{tenant}`` hash tag keeps them in one cluster slot)::

    {prefix}:{<tenant>}:rpm    sorted set: lease id -> admission time (ms)
    {prefix}:{<tenant>}:tpm    hash: tokens, ts (ms)
    {prefix}:{<tenant>}:conc   sorted set: lease id -> lease expiry (ms)

Settlement (concurrency release, TPM correction, RPM give-back) is queued by :meth:`settle`
without I/O and written by a background task in one pipeline per batch, as soon as it can.
The same task renews the leases of this router's running requests every third of the lease
TTL, so only a crashed router's leases expire.

When Redis does not answer (connection refused, timeout), admission falls back to
:class:`~.limits.LocalLimits` (each limit divided by the assumed replica count), logs once,
and tries Redis again after ``retry_s``; a recovery is logged once too.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import NoScriptError, RedisError

from runtime.admission.limits import (
    WINDOW_S,
    Lease,
    LimitKind,
    LocalLimits,
    Quota,
    refusal,
    settle_refund,
)
from runtime.redis_conn import async_client

logger = logging.getLogger(__name__)

# KEYS: rpm, tpm, conc. ARGV: lease id, rpm, tpm, concurrency, tokens, lease ms, window ms.
# Returns {status, retry_ms, detail}: status "ok" | "rpm" | "tpm" | "concurrency".
ADMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local id = ARGV[1]
local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local debit, lease, window = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local used = redis.call('ZCARD', KEYS[1])
if used >= rpm then
  local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {'rpm', math.max(1, tonumber(oldest[2]) + window - now), used}
end
local b = redis.call('HMGET', KEYS[2], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]), tonumber(b[2])
if tokens == nil or ts == nil then tokens, ts = tpm, now end
tokens = math.min(tpm, tokens + math.max(0, now - ts) * tpm / window)
local need = math.min(debit, tpm)
if tokens < need then
  return {'tpm', math.max(1, math.ceil((need - tokens) * window / tpm)), math.floor(tokens)}
end
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
local held = redis.call('ZCARD', KEYS[3])
if held >= conc then
  return {'concurrency', 1000, held}
end
redis.call('ZADD', KEYS[1], now, id)
redis.call('PEXPIRE', KEYS[1], window + 1000)
local left = tokens - debit
redis.call('HSET', KEYS[2], 'tokens', tostring(left), 'ts', now)
redis.call('PEXPIRE', KEYS[2], math.ceil((tpm - left) * window / tpm) + window)
redis.call('ZADD', KEYS[3], now + lease, id)
redis.call('PEXPIRE', KEYS[3], lease * 2)
return {'ok', 0, 0}
"""

# KEYS: rpm, tpm, conc. ARGV: lease id, tokens to credit back, "1" to drop the RPM entry.
SETTLE_LUA = """
redis.call('ZREM', KEYS[3], ARGV[1])
if ARGV[3] == '1' then redis.call('ZREM', KEYS[1], ARGV[1]) end
local refund = tonumber(ARGV[2])
if refund ~= 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HINCRBYFLOAT', KEYS[2], 'tokens', refund)
end
return 1
"""

# KEYS: conc. ARGV: lease ms, then lease ids. Pushes the expiry of leases still held.
RENEW_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lease = tonumber(ARGV[1])
for i = 2, #ARGV do redis.call('ZADD', KEYS[1], 'XX', now + lease, ARGV[i]) end
redis.call('PEXPIRE', KEYS[1], lease * 2)
return #ARGV - 1
"""

_KINDS = {b"rpm": LimitKind.RPM, b"tpm": LimitKind.TPM, b"concurrency": LimitKind.CONCURRENCY}
_MAX_PENDING_SETTLES = 100_000


def _text(value: Any) -> bytes:
    return value if isinstance(value, bytes) else str(value).encode()


class RedisLimits:
    """See the module docstring. ``start()`` in the lifespan, ``stop()`` at shutdown."""

    def __init__(
        self,
        redis_url: str,
        *,
        prefix: str = "switchyard:limits",
        replicas: int = 2,
        lease_ttl_s: float = 30.0,
        timeout_s: float = 0.5,
        retry_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not lease_ttl_s > 0:
            raise ValueError("lease_ttl_s must be > 0")
        self._redis_url = redis_url
        self._prefix = prefix
        self._lease_ms = int(lease_ttl_s * 1000)
        self._timeout_s = timeout_s
        self._retry_s = retry_s
        self._clock = clock
        self.local = LocalLimits(replicas=replicas, clock=clock)
        self._client: aioredis.Redis[bytes] | None = None
        self._admit: Any = None
        self._settle: Any = None
        self._renew: Any = None
        self._down_until = 0.0
        self._down = False
        self._active: dict[str, Lease] = {}
        self._settles: list[tuple[Lease, int, bool]] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._stopping = False

    @property
    def degraded(self) -> bool:
        """True while admission uses the local fallback."""
        return self._down

    def keys(self, tenant: str) -> list[str]:
        base = f"{self._prefix}:{{{tenant}}}"
        return [f"{base}:rpm", f"{base}:tpm", f"{base}:conc"]

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
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name="limits-settler")

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

    # -- the request path -----------------------------------------------------------------

    async def acquire(self, tenant: str, quota: Quota, *, tokens: int) -> Lease:
        """Admit one request of ``tokens`` (prompt + max_tokens) or raise
        :class:`~.limits.LimitExceededError`."""
        lease_id = uuid.uuid4().hex
        if self._admit is None or self._clock() < self._down_until:
            return self.local.acquire(lease_id, tenant, quota, tokens=tokens)
        args = [lease_id, quota.rpm, quota.tpm, quota.concurrency, tokens, self._lease_ms,
                int(WINDOW_S * 1000)]  # fmt: skip
        try:
            status, retry_ms, detail = await self._admit(keys=self.keys(tenant), args=args)
        except (RedisError, OSError) as exc:
            self._went_down(exc)
            return self.local.acquire(lease_id, tenant, quota, tokens=tokens)
        self._came_back()
        kind = _KINDS.get(_text(status))
        if kind is not None:
            raise refusal(kind, int(retry_ms) / 1000.0, quota, float(detail))
        lease = Lease(id=lease_id, tenant=tenant, quota=quota, tokens=tokens, source="redis")
        self._active[lease_id] = lease
        return lease

    def settle(self, lease: Lease, *, actual_tokens: int | None, served: bool) -> None:
        """The request ended (no I/O here). ``served``: it reached an engine; ``actual_tokens``:
        prompt + completion tokens from its usage, if known."""
        if lease.settled:
            return
        lease.settled = True
        if lease.source == "local":
            self.local.settle(lease, actual_tokens=actual_tokens, served=served)
            return
        self._active.pop(lease.id, None)
        if len(self._settles) < _MAX_PENDING_SETTLES:  # beyond: leases expire on their own
            refund = settle_refund(lease, actual_tokens=actual_tokens, served=served)
            self._settles.append((lease, refund, served))
        self._wake.set()

    # -- background -----------------------------------------------------------------------

    async def _run(self) -> None:
        renew_every = self._lease_ms / 3000.0
        next_renew = self._clock() + renew_every
        while not self._stopping:
            timeout = max(0.0, next_renew - self._clock())
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await self._wake.wait()
            self._wake.clear()
            await self.flush()
            if self._clock() >= next_renew:
                await self.renew()
                next_renew = self._clock() + renew_every
        await self.flush()

    async def flush(self) -> int:
        """Write the queued settlements in one pipeline; returns how many were written."""
        if not self._settles or self._client is None or self._clock() < self._down_until:
            return 0
        batch, self._settles = self._settles, []
        calls = [
            (self.keys(lease.tenant), [lease.id, refund, "0" if served else "1"])
            for lease, refund, served in batch
        ]
        try:
            await self._pipelined(self._settle, SETTLE_LUA, calls)
        except (RedisError, OSError) as exc:
            self._went_down(exc)
            self._settles = batch + self._settles
            return 0
        self._came_back()
        return len(batch)

    async def renew(self) -> int:
        """Push the lease expiry of this router's running requests (one pipeline)."""
        if not self._active or self._client is None:
            return 0
        by_tenant: dict[str, list[str]] = {}
        for lease in self._active.values():
            by_tenant.setdefault(lease.tenant, []).append(lease.id)
        calls = [
            ([self.keys(tenant)[2]], [self._lease_ms, *ids]) for tenant, ids in by_tenant.items()
        ]
        try:
            await self._pipelined(self._renew, RENEW_LUA, calls)
        except (RedisError, OSError) as exc:
            self._went_down(exc)
            return 0
        return len(self._active)

    async def _pipelined(
        self, script: Any, source: str, calls: list[tuple[list[str], list[Any]]]
    ) -> None:
        """Run ``script`` once per call in one pipeline (EVALSHA only: redis-py's script
        objects would add a SCRIPT EXISTS round trip to every pipeline); loads the script
        and retries once if the server does not know it (restarted, flushed)."""
        assert self._client is not None
        for attempt in range(2):
            pipe = self._client.pipeline(transaction=False)
            for keys, args in calls:
                pipe.evalsha(script.sha, len(keys), *keys, *args)
            try:
                await pipe.execute()
            except NoScriptError:
                if attempt:
                    raise
                await self._client.script_load(source)  # type: ignore[no-untyped-call]
            else:
                return

    def _went_down(self, exc: BaseException) -> None:
        self._down_until = self._clock() + self._retry_s
        if not self._down:
            self._down = True
            logger.warning(
                "limits: Redis unreachable (%r); using per-process limits (each limit / %d "
                "assumed replicas) until it answers again",
                exc,
                self.local.replicas,
            )

    def _came_back(self) -> None:
        if self._down:
            self._down = False
            logger.warning("limits: Redis answers again; limits are global once more")
