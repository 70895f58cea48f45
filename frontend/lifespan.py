"""The control plane's ASGI lifespan: start and stop the dashboard's live relay (with the
staff feed's control source)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from django.conf import settings

from frontend.control_feed import ControlSource
from frontend.relay import LiveRelay, live_namespace

Message = MutableMapping[str, Any]


async def lifespan(
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[Message]],
    send: Callable[[Message], Awaitable[None]],
) -> None:
    relay: LiveRelay | None = None
    control: ControlSource | None = None
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            control = ControlSource(settings.REDIS_URL, live_namespace())
            relay = LiveRelay(settings.REDIS_URL, live_namespace(), control=control)
            await relay.start()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            if relay is not None:
                await relay.stop()
            if control is not None:
                control.close()
            await send({"type": "lifespan.shutdown.complete"})
            return
