"""The control plane's ASGI lifespan: start and stop the dashboard's live relay."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

from frontend.relay import LiveRelay, live_namespace

Message = MutableMapping[str, Any]


async def lifespan(
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    relay: LiveRelay | None = None
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            relay = LiveRelay(settings.REDIS_URL, live_namespace())
            await relay.start()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if relay is not None:
                await relay.stop()
            await send({"type": "lifespan.shutdown.complete"})
            return
