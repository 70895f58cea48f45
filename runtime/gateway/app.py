"""The router's ASGI application: lifespan (build and start everything) and HTTP routes.

``create_app()`` is the uvicorn factory. The lifespan builds one :class:`RouterState` and puts
it in the lifespan ``state`` dict, which uvicorn copies into every request scope; HTTP goes
to the consumers through the flavour ``SWITCHYARD_ROUTER_HTTP`` names: the pure ASGI routes
(:mod:`runtime.gateway.routes`, the default) or Channels (:mod:`runtime.gateway.channels_http`,
kept for the A/B of issue #27). Nothing happens at import time.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Awaitable, Callable

from runtime.gateway.config import RouterConfig
from runtime.gateway.consumers import Receive, Scope, Send
from runtime.gateway.errors import ApiError
from runtime.gateway.state import STATE_KEY, RouterState, build_state

logger = logging.getLogger(__name__)


def http_entry(flavour: str) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    """The HTTP entry of ``flavour`` (``RouterConfig.router_http``): the pure ASGI routes
    (``asgi``, the default) or the Channels consumers (``channels``, kept for the A/B)."""
    if flavour == "channels":
        from runtime.gateway.channels_http import ChannelsHttp  # noqa: PLC0415 - imports Django

        return ChannelsHttp()
    from runtime.gateway.routes import HttpRoutes  # noqa: PLC0415

    return HttpRoutes()


class RouterApp:
    """A pure ASGI callable: ``lifespan`` handled here, ``http`` routed to consumers."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.http = http_entry(config.router_http)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if STATE_KEY not in scope.get("state", {}):
                await _not_started(send)
                return
            await self.http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(scope, receive, send)
        else:
            raise ValueError(f"the router serves HTTP only, not {kind!r}")

    async def _lifespan(self, scope: Scope, receive: Receive, send: Send) -> None:
        state: RouterState | None = None
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                if "state" not in scope:
                    await send(
                        {
                            "type": "lifespan.startup.failed",
                            "message": "the server does not support lifespan state",
                        }
                    )
                    return
                try:
                    state = build_state(self.config)
                    settle_heap()  # before start(): no probe or request is in flight to stall
                    await state.start()
                    gc.freeze()  # what start() built (the snapshot) too; no collection, no stall
                except Exception as exc:
                    logger.exception("router: startup failed")
                    await send({"type": "lifespan.startup.failed", "message": repr(exc)})
                    return
                scope["state"][STATE_KEY] = state
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                if state is not None:
                    await state.stop()
                await send({"type": "lifespan.shutdown.complete"})
                return


def settle_heap() -> None:
    """Move everything startup built (Django, the modules, the state) out of the cyclic
    garbage collector's view: its full collections then walk only what requests made since,
    not the whole heap, every time. Objects are still freed by reference counting.

    The collection blocks the loop (seconds on a large heap): it runs before the state starts,
    so no health probe's timeout runs across it."""
    gc.collect()
    gc.freeze()


async def _not_started(send: Send) -> None:
    error = ApiError.of("not_ready", reason="it has not started (no ASGI lifespan ran)")
    await send(
        {
            "type": "http.response.start",
            "status": error.status,
            "headers": [(b"content-type", b"application/json")],
        }
    )
    await send({"type": "http.response.body", "body": error.body()})


def create_app(config: RouterConfig | None = None) -> RouterApp:
    """The uvicorn factory: ``uvicorn --factory runtime.gateway.app:create_app``."""
    return RouterApp(config or RouterConfig.from_env())
