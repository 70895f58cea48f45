"""The two levels: L1 in process (W-TinyLFU via ``theine``, bounded in bytes) over L2 in Redis
(TTL, and a per-tenant byte quota so one tenant cannot evict the others).

``theine`` bounds a cache by entry count, so L1 turns its byte budget into a count: entries
larger than ``max_entry_bytes`` stay out of L1 (they live in L2 only) and the count is
``budget_bytes // max_entry_bytes``; L1 never holds more than its budget. (``slot_bytes``
sets a smaller slot, e.g. the mean entry size: more entries fit, and the budget holds on
average rather than strictly.) L1 entries live at
most ``l1_ttl_s`` (a purge elsewhere also drops them at once, see :mod:`.purge`).

L2 keeps each entry under ``{ns}:cache:{scope}:{version}:{key}`` with the model's TTL, and a
per-scope index (sorted set: key -> expiry) and size hash; one Lua script stores an entry,
forgets expired ones and evicts the soonest-expiring until the scope fits its quota. What L2
holds is sealed (:mod:`.sealing`: AES-GCM, the tenant's or the shared scope's key); L1 holds
the decoded entry, so only an L2 read or write pays for the encryption.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import redis.asyncio as aioredis
from theine import Cache

from runtime.cache.entry import Entry, decode_entry, encode_entry
from runtime.cache.metrics import CacheMetrics
from runtime.cache.sealing import Sealer
from runtime.contract import cache_entry_key, cache_index_keys

_STORE = """
local now, ttl_ms = tonumber(ARGV[1]), tonumber(ARGV[2])
local quota, size = tonumber(ARGV[3]), tonumber(ARGV[4])
local index, sizes, key = KEYS[1], KEYS[2], KEYS[3]
local total = tonumber(redis.call('HGET', sizes, '__total') or '0')
local function forget(k)
  total = total - tonumber(redis.call('HGET', sizes, k) or '0')
  redis.call('HDEL', sizes, k); redis.call('ZREM', index, k)
end
for _, k in ipairs(redis.call('ZRANGEBYSCORE', index, '-inf', now)) do forget(k) end
if size > quota then redis.call('HSET', sizes, '__total', total); return -1 end
forget(key)
local evicted = 0
while total + size > quota do
  local victim = redis.call('ZRANGE', index, 0, 0)[1]
  if not victim then break end
  forget(victim); redis.call('DEL', victim)
  evicted = evicted + 1
end
redis.call('SET', key, ARGV[5], 'PX', ttl_ms)
redis.call('ZADD', index, now + ttl_ms, key)
redis.call('HSET', sizes, key, size)
redis.call('HSET', sizes, '__total', total + size)
return evicted
"""


@dataclass(slots=True, kw_only=True)
class StoreConfig:
    l1_bytes: int = 64 * 1024 * 1024
    max_entry_bytes: int = 64 * 1024
    slot_bytes: int = 0  # bytes per L1 slot; 0 = max_entry_bytes (a strict byte bound)
    l1_ttl_s: float = 300.0
    tenant_quota_bytes: int = 256 * 1024 * 1024


@dataclass(slots=True)
class L1:
    """W-TinyLFU in process, bounded in bytes (see the module)."""

    config: StoreConfig
    metrics: CacheMetrics
    _cache: Cache[str, Entry] = field(init=False)
    inserts: int = 0

    def __post_init__(self) -> None:
        slot = self.config.slot_bytes or self.config.max_entry_bytes
        slots = max(1, self.config.l1_bytes // slot)
        self._cache = Cache(slots)
        self.metrics.l1_capacity(slots, lambda: len(self._cache))

    def get(self, key: str) -> Entry | None:
        value, found = self._cache.get(key)
        return value if found else None

    def put(self, key: str, entry: Entry, size: int) -> None:
        if size <= self.config.max_entry_bytes:
            self._cache.set(key, entry, timedelta(seconds=self.config.l1_ttl_s))
            self.inserts += 1

    def clear(self) -> None:
        self._cache.clear()


class ResultStore:
    """L1 over L2 (see the module)."""

    def __init__(
        self, client: aioredis.Redis[bytes], *, namespace: str, config: StoreConfig,
        metrics: CacheMetrics, sealer: Sealer,
    ) -> None:  # fmt: skip
        self._redis = client
        self.sealer = sealer
        self._ns = namespace
        self.config = config
        self.metrics = metrics
        self.l1 = L1(config, metrics)
        self._store: Any = client.register_script(_STORE)

    async def get(self, scope: str, version: str, key: str) -> Entry | None:
        entry = self.l1.get(key)
        if entry is not None:
            self.metrics.lookup("l1", hit=True)
            return entry
        self.metrics.lookup("l1", hit=False)
        name = cache_entry_key(self._ns, scope, version, key)
        sealed = await self._redis.get(name)
        raw = self.sealer.open(sealed, scope, name) if sealed is not None else None
        entry = decode_entry(raw) if raw is not None else None
        self.metrics.lookup("l2", hit=entry is not None)
        if entry is not None and raw is not None:
            self.l1.put(key, entry, len(raw))
        return entry

    async def put(self, scope: str, version: str, key: str, entry: Entry, *, ttl_s: int) -> None:
        raw = encode_entry(entry)
        self.l1.put(key, entry, len(raw))
        index, sizes = cache_index_keys(self._ns, scope)
        name = cache_entry_key(self._ns, scope, version, key)
        sealed = self.sealer.seal(raw, scope, name)
        evicted = await self._store(
            keys=[index, sizes, name],
            args=[int(time.time() * 1000), max(1, ttl_s) * 1000, self.config.tenant_quota_bytes,
                  len(sealed), sealed],
        )  # fmt: skip
        self.metrics.stored(len(sealed), evicted=max(0, int(evicted)))
