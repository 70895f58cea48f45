"""Routers' live documents (Redis pub/sub) into the channel layer group the browsers joined.

Each control-plane process runs one :class:`LiveRelay` (started by the ASGI lifespan in
``config.asgi``). Only one relay in the deployment forwards at a time: it holds a short lease
in Redis (``{ns}:live:relay``, renewed every second) so a browser gets each document once
however many processes serve websockets; if the holder dies, another takes over within
:data:`LEASE_S`. The websocket consumers (:mod:`frontend.consumers`) are in group
:data:`GROUP` and filter per user. With a ``control`` source, the holder also sends operators
the control document (rollouts, scaling, queued actions: :mod:`frontend.control_feed`) to
:data:`~frontend.control_feed.STAFF_GROUP` once a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec
import redis.asyncio as aioredis
from channels.layers import get_channel_layer
from django.conf import settings
from redis.exceptions import RedisError

from frontend.control_feed import STAFF_GROUP
from runtime import contract
from runtime.contract import live_backlog, live_channel, live_relay_lease
from runtime.redis_conn import async_client, cancel_and_wait, raise_if_cancelling

logger = logging.getLogger(__name__)

GROUP: Final = "dashboard.live"
LEASE_S: Final = 3.0
_RENEW_LUA = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) and 1 or 0
"""


def live_namespace() -> str:
    """The namespace the routers publish under (the control plane's snapshot prefix's)."""
    return contract.namespace_of(settings.SNAPSHOT_REDIS_PREFIX)


def backlog_key() -> str:
    return live_backlog(live_namespace())


Control = Callable[[], Awaitable[dict[str, Any]]]


class LiveRelay:
    def __init__(self, redis_url: str, namespace: str, control: Control | None = None) -> None:
        self._redis_url = redis_url
        self._namespace = namespace
        self._control = control
        self._lease_key = live_relay_lease(namespace)
        self._me = f"{socket.gethostname()}:{os.getpid()}:{id(self)}"
        self._task: asyncio.Task[None] | None = None
        self.forwarded = 0
        self.controls = 0

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="dashboard-live-relay")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)  # redis-py can swallow a cancellation mid-read

    async def _run(self) -> None:
        # No command retry: the loop below starts over (and resubscribes) after any error.
        client = async_client(
            self._redis_url, name="dashboard-relay", timeout_s=2.0, connect_timeout_s=1.0,
            retries=0,
        )  # fmt: skip
        try:
            while True:
                try:
                    if await self._hold_lease(client):
                        await self._forward(client)
                except (RedisError, OSError) as exc:
                    raise_if_cancelling()  # a cancellation redis-py turned into an error
                    logger.warning("dashboard relay: %r; retrying", exc)
                await asyncio.sleep(1.0)
        finally:
            with contextlib.suppress(RedisError, OSError):
                if await client.get(self._lease_key) == self._me.encode():
                    await client.delete(self._lease_key)
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()  # type: ignore[attr-defined]

    async def _hold_lease(self, client: aioredis.Redis[bytes]) -> bool:
        script = client.register_script(_RENEW_LUA)  # EVALSHA, EVAL on a miss
        held = await script(keys=[self._lease_key], args=[self._me, int(LEASE_S * 1000)])
        return bool(held)

    async def _forward(self, client: aioredis.Redis[bytes]) -> None:
        """Relay messages while the lease holds (renewed about once a second)."""
        layer = get_channel_layer()
        if layer is None:
            raise RuntimeError("the dashboard relay needs CHANNEL_LAYERS")
        pubsub = client.pubsub()
        await pubsub.subscribe(live_channel(self._namespace))
        loop = asyncio.get_running_loop()
        renew_at = loop.time() + 1.0
        try:
            while True:
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=0.5)
                raise_if_cancelling()
                if message is not None and message.get("type") == "message":
                    document: dict[str, Any] = msgspec.json.decode(message["data"])
                    await layer.group_send(GROUP, {"type": "live.doc", "doc": document})
                    self.forwarded += 1
                if loop.time() >= renew_at:
                    renew_at = loop.time() + 1.0
                    if not await self._hold_lease(client):
                        return
                    await self._send_control(layer)
        finally:
            with contextlib.suppress(RedisError, OSError):
                await pubsub.aclose()  # type: ignore[attr-defined]

    async def _send_control(self, layer: Any) -> None:
        if self._control is None:
            return
        try:
            document = await self._control()
        except Exception:  # a bad read must not stop the live documents
            raise_if_cancelling()
            logger.exception("dashboard relay: building the control document failed")
            return
        await layer.group_send(STAFF_GROUP, {"type": "control.doc", "doc": document})
        self.controls += 1
