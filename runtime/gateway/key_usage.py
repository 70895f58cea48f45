"""Off-path record of when each API key was last used.

The request path only writes a dict entry (prefix → newest unix time). A background task
flushes the batch every few seconds in one Lua call that keeps, per key, the newer of the
stored and the new time in the Redis hash ``switchyard:apikey:last_used``; the control plane
copies that hash into PostgreSQL. A failed flush keeps the batch for the next one.
"""

from __future__ import annotations

import logging

from redis.exceptions import RedisError

from runtime.flusher import PeriodicFlusher

logger = logging.getLogger(__name__)

# KEYS[1] the hash; ARGV: prefix1, time1, prefix2, time2, ... Keeps the max per field.
_HSET_MAX_LUA = """
local n = 0
for i = 1, #ARGV, 2 do
  local current = tonumber(redis.call('HGET', KEYS[1], ARGV[i]) or '0')
  if tonumber(ARGV[i + 1]) > current then
    redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
    n = n + 1
  end
end
return n
"""


class KeyUsageRecorder(PeriodicFlusher):
    def __init__(self, redis_url: str, *, hash_key: str, interval_s: float = 5.0) -> None:
        super().__init__(redis_url, interval_s=interval_s, name="switchyard-key-usage")
        self._hash_key = hash_key
        self._pending: dict[str, float] = {}

    def record(self, prefix: str, when: float) -> None:
        """Note a use of the key ``prefix`` at unix time ``when`` (no I/O)."""
        if when > self._pending.get(prefix, 0.0):
            self._pending[prefix] = when

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush(self) -> int:
        """Write the pending batch; returns how many keys moved forward (0 on failure)."""
        if not self._pending or self._client is None:
            return 0
        batch, self._pending = self._pending, {}
        args: list[str] = []
        for prefix, when in batch.items():
            args += [prefix, f"{when:.3f}"]
        try:
            script = self._client.register_script(_HSET_MAX_LUA)  # EVALSHA, EVAL on a miss
            moved = await script(keys=[self._hash_key], args=args)
        except (RedisError, OSError) as exc:
            logger.warning("key usage: flush of %d keys failed (%r); will retry", len(batch), exc)
            for prefix, when in batch.items():
                self.record(prefix, when)
            return 0
        return int(moved)
