"""Off-path record of when each API key was last used.

The request path only writes a dict entry (prefix → newest unix time). A background task
flushes the batch every few seconds in one Lua call that keeps, per key, the newer of the
stored and the new time in the Redis hash ``switchyard:apikey:last_used``; the control plane
copies that hash into PostgreSQL. A failed flush keeps the batch for the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runtime.redis_conn import async_client

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


class KeyUsageRecorder:
    def __init__(self, redis_url: str, *, hash_key: str, interval_s: float = 5.0) -> None:
        self._redis_url = redis_url
        self._hash_key = hash_key
        self._interval_s = interval_s
        self._pending: dict[str, float] = {}
        self._client: aioredis.Redis[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    def record(self, prefix: str, when: float) -> None:
        """Note a use of the key ``prefix`` at unix time ``when`` (no I/O)."""
        if when > self._pending.get(prefix, 0.0):
            self._pending[prefix] = when

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("KeyUsageRecorder already started")
        self._client = async_client(
            self._redis_url, name="switchyard-key-usage", timeout_s=5.0, connect_timeout_s=1.0
        )
        self._stopping.clear()
        self._task = asyncio.create_task(self._run(), name="key-usage-flusher")

    async def stop(self) -> None:
        """Stop the timer, flush what is pending once more, close the connection."""
        self._stopping.set()
        task, self._task = self._task, None
        if task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.flush()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()  # type: ignore[attr-defined]

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

    async def _run(self) -> None:
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=self._interval_s)
            if not self._stopping.is_set():
                await self.flush()
