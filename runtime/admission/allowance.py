"""Pre-granted admission allowances: most requests of a busy tenant are admitted from memory.

A router process takes a tenant's limits from Redis in chunks (one ``EVALSHA``,
:data:`GRANT_LUA`): ``r`` RPM entries, ``t`` TPM tokens and ``c`` concurrency slots, written
into the same keys the per-request script (:mod:`.redis_limits`) uses, so Redis stays the
one source of truth. Requests then spend the allowance in memory; a background task takes
the next chunk before it runs out, drops RPM entries past their validity and returns
everything unused when the tenant goes idle, its quota changes, or the router stops
(:data:`RETURN_LUA`). A request that does not fit the allowance takes the exact per-request
path, and so does every request with a credit ask (escrow is not leased).

Global correctness (the bound):

- **No overshoot.** RPM entries are written with the score ``grant time + ttl`` (Redis's
  clock), and an entry is used locally only until ``ttl`` after the grant was *asked* (the
  router's clock, earlier), so every admission is inside the 60 s window of an entry that
  Redis counts. Tokens are debited from the bucket when granted; slots are concurrency
  leases in Redis (renewed with the router's other leases, so a crashed router's slots
  expire). Admitted requests per window / tokens / requests at once never exceed the limit.
- **Bounded under-admission.** Another router may be refused while this one holds unused
  allowance. Each grant takes at most ``1 / share`` of the free headroom (``share`` = 4 x
  the assumed replica count), at most ``max_requests`` entries and ``max_slots`` slots,
  and nothing when that is under :data:`MIN_GRANT` entries or the tokens of
  :data:`MIN_GRANT` average requests (so a tenant near its limit, or one with a small
  limit, is admitted exactly). Unused entries go back within ``ttl`` plus
  one background tick; a leased request's entry counts in the window up to ``ttl`` longer.

Everything here is pure logic on an injected clock; :class:`~.redis_limits.RedisLimits`
runs the scripts.
"""

from __future__ import annotations

import collections
import math
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.admission.limits import WINDOW_S, Lease, Quota, RateState

MIN_GRANT = 2  # fewer RPM entries than this: no allowance (exact per-request path)
_MARGIN_S = 0.05  # local validity ends this much before Redis's score (clock drift, RTT)

# KEYS: rpm, tpm, conc. ARGV: grant id, rpm, tpm, concurrency, wanted entries, tokens,
# slots, ttl ms, lease ms, window ms, share, min entries, min tokens. Returns {entries,
# tokens, slots} granted (all 0: none, the tenant is near a limit), then the RPM entries in
# the window and the tokens left in the bucket (floor) after the grant (the headers' view).
GRANT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local gid = ARGV[1]
local rpm, tpm, conc = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4])
local want_r, want_t, want_c = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local ttl, lease, window = tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local share, min_r, min_t = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local r = math.min(want_r, math.floor((rpm - redis.call('ZCARD', KEYS[1])) / share))
local b = redis.call('HMGET', KEYS[2], 'tokens', 'ts')
local tokens, ts = tonumber(b[1]), tonumber(b[2])
if tokens == nil or ts == nil then tokens, ts = tpm, now end
tokens = math.min(tpm, tokens + math.max(0, now - ts) * tpm / window)
local tk = math.min(want_t, math.floor(math.max(0, tokens) / share))
local held = #redis.call('ZRANGEBYSCORE', KEYS[3], now, '+inf')
local c = math.min(want_c, math.floor((conc - held) / share))
if r < min_r or tk < min_t or (want_c > 0 and c < 1) then
  return {0, 0, 0, redis.call('ZCARD', KEYS[1]), math.floor(tokens)}
end
for i = 1, r do redis.call('ZADD', KEYS[1], now + ttl, gid .. ':r' .. i) end
redis.call('PEXPIRE', KEYS[1], window + ttl + 1000)
local left = tokens - tk
redis.call('HSET', KEYS[2], 'tokens', tostring(left), 'ts', now)
redis.call('PEXPIRE', KEYS[2], math.ceil((tpm - left) * window / tpm) + window)
if c > 0 then
  for i = 1, c do redis.call('ZADD', KEYS[3], now + lease, gid .. ':c' .. i) end
  redis.call('PEXPIRE', KEYS[3], lease * 2)
end
return {r, tk, c, redis.call('ZCARD', KEYS[1]), math.floor(left)}
"""

# KEYS: rpm, tpm, conc. ARGV: tokens to credit back, number of RPM entries n, the n entries,
# then the slots. Removes what the router did not use.
RETURN_LUA = """
local refund = tonumber(ARGV[1])
if refund ~= 0 and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('HINCRBYFLOAT', KEYS[2], 'tokens', refund)
end
local n = tonumber(ARGV[2])
for i = 3, 2 + n do redis.call('ZREM', KEYS[1], ARGV[i]) end
for i = 3 + n, #ARGV do redis.call('ZREM', KEYS[3], ARGV[i]) end
return 1
"""


@dataclass(frozen=True, slots=True)
class GrantAsk:
    """What to ask Redis for, for one tenant (one :data:`GRANT_LUA` call)."""

    tenant: str
    quota: Quota
    grant_id: str
    requests: int
    tokens: int
    slots: int
    asked_at: float  # the local clock when asked: validity counts from here
    min_tokens: int = 1  # fewer tokens than this (MIN_GRANT average requests): no grant

    def args(self, *, ttl_ms: int, lease_ms: int, window_ms: int, share: int) -> list[object]:
        q = self.quota
        return [self.grant_id, q.rpm, q.tpm, q.concurrency, self.requests, self.tokens,
                self.slots, ttl_ms, lease_ms, window_ms, share, MIN_GRANT,
                self.min_tokens]  # fmt: skip


@dataclass(frozen=True, slots=True)
class Giveback:
    """Unused allowance to remove from Redis (one :data:`RETURN_LUA` call)."""

    tenant: str
    tokens: float
    entries: tuple[str, ...]
    slots: tuple[str, ...]

    def args(self) -> list[object]:
        return [self.tokens, len(self.entries), *self.entries, *self.slots]


@dataclass(slots=True)
class _Allowance:
    quota: Quota
    entries: collections.deque[tuple[str, float]] = field(default_factory=collections.deque)
    tokens: float = 0.0
    free: list[str] = field(default_factory=list)
    busy: set[str] = field(default_factory=set)
    last_used: float = 0.0
    demand: int = 0  # requests (admitted here or not) since ``since``
    since: float = 0.0
    rate: float = 0.0  # requests/s over the last full ttl
    avg_tokens: float = 0.0
    stale: list[str] = field(default_factory=list)  # entries past validity, to return
    target: int = MIN_GRANT  # entries wanted at hand (from the demand at the last ask)
    slot_target: int = 2
    asking: bool = False
    hungry: bool = False
    backoff_until: float = 0.0
    seen_used: int = 0  # RPM entries in Redis's window at the last grant (ours included)
    seen_tokens: float = 0.0  # tokens left in Redis's bucket at the last grant


class Allowances:
    """Per-tenant allowances of one router process (see the module docstring)."""

    __slots__ = ("_by_tenant", "_clock", "_late", "_orphans", "idle_s", "max_requests",
                 "max_slots", "ttl_s")  # fmt: skip

    def __init__(
        self,
        *,
        ttl_s: float = 1.0,
        idle_s: float = 2.0,
        max_requests: int = 256,
        max_slots: int = 1024,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not ttl_s > 2 * _MARGIN_S:
            raise ValueError(f"ttl_s must be > {2 * _MARGIN_S}")
        self.ttl_s = ttl_s
        self.idle_s = idle_s
        self.max_requests = max_requests
        self.max_slots = max_slots
        self._clock = clock
        self._by_tenant: dict[str, _Allowance] = {}
        self._orphans: dict[str, str] = {}  # busy slot of a retired allowance -> tenant
        self._late: list[Giveback] = []  # grants that arrived for a retired allowance

    # -- the request path (memory only) -------------------------------------------------

    def take(self, tenant: str, quota: Quota, tokens: int) -> Lease | None:
        """A lease from ``tenant``'s allowance, or None (then admit it the exact way)."""
        now = self._clock()
        a = self._by_tenant.get(tenant)
        if a is not None and a.quota != quota:  # the tenant's limits changed: start over
            self._retire(tenant, a)
            a = None
        if a is None:
            a = self._by_tenant[tenant] = _Allowance(quota=quota, since=now, last_used=now)
        a.demand += 1
        if now - a.since >= self.ttl_s:  # a new rate window
            a.rate, a.demand, a.since = a.demand / (now - a.since), 0, now
        a.avg_tokens = tokens if a.avg_tokens == 0 else 0.8 * a.avg_tokens + 0.2 * tokens
        while a.entries and a.entries[0][1] <= now:
            a.stale.append(a.entries.popleft()[0])  # past its validity: :meth:`expire` returns it
        if not a.entries or a.tokens < tokens or not a.free:
            a.hungry = True
            return None
        entry, _ = a.entries.popleft()
        slot = a.free.pop()
        a.busy.add(slot)
        a.tokens -= tokens
        a.last_used = now
        low = max(2, a.target // 2)  # refill at half, so the next chunk comes before it ends
        if (
            len(a.entries) < low
            or len(a.free) < max(2, a.slot_target // 4)
            or (a.tokens < low * a.avg_tokens)
        ):
            a.hungry = True
        # Redis's view at the last grant, with this allowance's unspent part given back.
        rates = RateState.of(
            quota,
            used=a.seen_used - len(a.entries),
            tokens=a.seen_tokens + a.tokens,
            requests_reset_s=WINDOW_S,
        )
        return Lease(id=entry, tenant=tenant, quota=quota, tokens=tokens, source="allowance",
                     slot=slot, rates=rates)  # fmt: skip

    def put_back(self, lease: Lease, refund: int) -> tuple[int, bool]:
        """``lease`` settled: its slot is free again. Returns the tokens still to credit
        back in Redis (0 when the allowance took them) and whether the slot must be
        released in Redis (its allowance was retired meanwhile)."""
        a = self._by_tenant.get(lease.tenant)
        if a is not None and lease.slot in a.busy:
            a.busy.discard(lease.slot)
            a.free.append(lease.slot)
            a.tokens += refund
            return 0, False
        return refund, self._orphans.pop(lease.slot, None) is not None

    # -- the background task ------------------------------------------------------------

    @property
    def wants(self) -> bool:
        return any(a.hungry and not a.asking for a in self._by_tenant.values())

    def asks(self) -> list[GrantAsk]:
        """The grants to ask for now (each tenant at most one at a time)."""
        now = self._clock()
        out: list[GrantAsk] = []
        for tenant, a in self._by_tenant.items():
            rate = max(a.rate, a.demand / max(now - a.since, 0.05))
            if not a.hungry or a.asking or now < a.backoff_until or a.demand + a.rate < 2:
                continue
            target = min(self.max_requests, max(MIN_GRANT, math.ceil(rate * self.ttl_s * 2)))
            valid = sum(1 for _, until in a.entries if until > now)
            requests = max(MIN_GRANT, target - valid)
            tokens = max(1, math.ceil((valid + requests) * a.avg_tokens - max(a.tokens, 0.0)))
            held = len(a.busy) + len(a.free)
            want_slots = min(self.max_slots, 2 * len(a.busy) + 4)
            slots = max(0, want_slots - held)
            a.target, a.slot_target = target, want_slots
            a.asking, a.hungry = True, False
            least = max(1, math.ceil(MIN_GRANT * a.avg_tokens))
            out.append(GrantAsk(tenant, a.quota, uuid.uuid4().hex[:16], requests,
                                max(tokens, least), slots, now, least))  # fmt: skip
        return out

    def granted(
        self, ask: GrantAsk, requests: int, tokens: int, slots: int, *, used: int = 0,
        bucket: float = 0.0,
    ) -> None:  # fmt: skip
        """Redis answered ``ask`` with this much (all 0: nothing; back off for one ttl);
        ``used`` and ``bucket``: its RPM window and TPM bucket after the grant."""
        a = self._by_tenant.get(ask.tenant)
        now = self._clock()
        if a is None or a.quota != ask.quota:
            if requests or tokens or slots:
                # Retired meanwhile: hand it straight back with the next :meth:`expire`.
                self._late.append(self._grant_giveback(ask, requests, tokens, slots))
            if a is not None:
                a.asking = False
            return
        a.asking = False
        a.seen_used, a.seen_tokens = used, bucket
        if requests == 0:
            a.backoff_until = now + self.ttl_s
            return
        until = ask.asked_at + self.ttl_s - _MARGIN_S
        a.entries.extend((f"{ask.grant_id}:r{i}", until) for i in range(1, requests + 1))
        a.tokens += tokens
        a.free.extend(f"{ask.grant_id}:c{i}" for i in range(1, slots + 1))

    def failed(self, ask: GrantAsk) -> None:
        """Redis did not answer ``ask``: try again after one ttl."""
        a = self._by_tenant.get(ask.tenant)
        if a is not None:
            a.asking = False
            a.backoff_until = self._clock() + self.ttl_s

    @staticmethod
    def _grant_giveback(ask: GrantAsk, requests: int, tokens: int, slots: int) -> Giveback:
        entries = tuple(f"{ask.grant_id}:r{i}" for i in range(1, requests + 1))
        return Giveback(ask.tenant, float(tokens), entries,
                        tuple(f"{ask.grant_id}:c{i}" for i in range(1, slots + 1)))  # fmt: skip

    def expire(self, *, everything: bool = False) -> list[Giveback]:
        """What to return now: entries past their validity; the whole allowance of a tenant
        idle for ``idle_s`` (or whose quota changed, or all of them with ``everything``, at
        shutdown). Busy slots of a retired allowance are released when their request
        settles (:meth:`put_back`)."""
        now = self._clock()
        out: list[Giveback] = []
        for tenant, a in list(self._by_tenant.items()):
            while a.entries and a.entries[0][1] <= now:
                a.stale.append(a.entries.popleft()[0])
            retire = everything or now - a.last_used >= self.idle_s
            if retire:
                self._retire(tenant, a)
            elif a.stale:
                out.append(Giveback(tenant, 0.0, tuple(a.stale), ()))
                a.stale = []
        out, self._late = self._late + out, []
        return out

    def _retire(self, tenant: str, a: _Allowance) -> None:
        del self._by_tenant[tenant]
        a.stale.extend(entry for entry, _ in a.entries)
        self._orphans.update((slot, tenant) for slot in a.busy)
        if a.stale or a.tokens or a.free:
            self._late.append(Giveback(tenant, a.tokens, tuple(a.stale), tuple(a.free)))

    def slots(self) -> dict[str, list[str]]:
        """Every slot this process holds in Redis, by tenant (to renew their lease)."""
        out: dict[str, list[str]] = {}
        for tenant, a in self._by_tenant.items():
            if a.free or a.busy:
                out.setdefault(tenant, []).extend([*a.free, *a.busy])
        for slot, tenant in self._orphans.items():
            out.setdefault(tenant, []).append(slot)
        return out

    def held(self, tenant: str) -> tuple[int, float, int, int]:
        """``tenant``'s (valid entries, tokens, free slots, busy slots): for tests, metrics."""
        a = self._by_tenant.get(tenant)
        if a is None:
            return 0, 0.0, 0, 0
        now = self._clock()
        valid = sum(1 for _, until in a.entries if until > now)
        return valid, a.tokens, len(a.free), len(a.busy)
