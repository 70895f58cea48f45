"""An endpoint's heartbeat: a Redis key with a TTL, refreshed while its worker lives.

The key is ``switchyard:endpoint:<id>:heartbeat`` (:func:`runtime.contract.endpoint_heartbeat_key`,
re-exported here); its value is
a small JSON object (endpoint id, state, base URL, pid, ``started``: the unix time its engine
started, new at each restart, and ``ts``: the unix time of the beat). The worker rewrites it every
third of the TTL and at each state change, and deletes it when it has stopped the engine; if the
worker dies, the key expires within one TTL. ``extra``, when given, adds fields read at each
beat (a LoRA engine's resident adapters, ``adapters``: a list of engine names; a failed read
keeps the last value). A Redis outage is logged, never fatal: the engine
keeps serving and the next beat retries.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runtime.contract import HEARTBEAT_KEY_PREFIX, endpoint_heartbeat_key
from runtime.redis_conn import async_client

__all__ = ["HEARTBEAT_KEY_PREFIX", "Heartbeat", "endpoint_heartbeat_key"]

log = logging.getLogger("switchyard.worker")

_REDIS_TIMEOUT_S = 2.0


class Heartbeat:
    """Keeps ``key`` alive in Redis (``SET key value PX ttl``) until :meth:`stop`."""

    def __init__(
        self,
        redis_url: str,
        key: str,
        *,
        ttl_s: float,
        fields: Mapping[str, object],
        extra: Callable[[], Awaitable[Mapping[str, object]]] | None = None,
    ) -> None:
        if ttl_s <= 0:
            raise ValueError("the heartbeat TTL must be positive")
        self.key = key
        self._ttl_ms = max(1, round(ttl_s * 1000))
        self._interval_s = ttl_s / 3
        self._fields = dict(fields)
        self._extra = extra
        self._extra_fields: Mapping[str, object] = {}
        self._state = "starting"
        self._client: aioredis.Redis[bytes] = async_client(
            redis_url, name="switchyard-heartbeat", timeout_s=_REDIS_TIMEOUT_S
        )
        self._task: asyncio.Task[None] | None = None
        self._failing = False

    async def start(self, state: str) -> None:
        self._state = state
        await self.beat()
        self._task = asyncio.create_task(self._loop(), name=f"heartbeat {self.key}")

    async def set_state(self, state: str, **fields: object) -> None:
        """Beat now with ``state``; ``fields`` replace the fixed fields' values from now on
        (a new engine: the ``extra`` fields read from the old one are dropped too)."""
        self._state = state
        if fields:
            self._fields.update(fields)
            self._extra_fields = {}
        await self.beat()

    async def beat(self) -> None:
        if self._extra is not None:
            try:
                self._extra_fields = await asyncio.wait_for(self._extra(), _REDIS_TIMEOUT_S)
            except Exception as exc:  # any failure keeps the last value
                log.debug("heartbeat %s: extra fields not read (%s)", self.key, exc)
        fields = {**self._fields, **self._extra_fields}
        value = json.dumps({**fields, "state": self._state, "ts": round(time.time(), 3)})
        try:
            await self._client.set(self.key, value, px=self._ttl_ms)
        except (RedisError, OSError) as exc:
            if not self._failing:
                log.warning("heartbeat %s: Redis write failed (%s); retrying", self.key, exc)
            self._failing = True
        else:
            if self._failing:
                log.info("heartbeat %s: Redis writes work again", self.key)
            self._failing = False

    async def _loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.beat()

    async def stop(self) -> None:
        """Stop beating and delete the key (bounded; a Redis error is logged)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        try:
            await self._client.delete(self.key)
        except (RedisError, OSError) as exc:
            log.warning("heartbeat %s: not deleted (%s); it expires by itself", self.key, exc)
        finally:
            await self._client.aclose()  # type: ignore[attr-defined]  # types-redis predates it
