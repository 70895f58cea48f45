"""The router's ASGI application: lifespan (build and start everything) and HTTP routes.

``create_app()`` is the uvicorn factory. The lifespan builds one :class:`RouterState` and puts
it in the lifespan ``state`` dict, which uvicorn copies into every request scope; HTTP goes
to a Channels ``URLRouter`` of consumers. Nothing happens at import time.
"""

from __future__ import annotations

import gc
import logging
from typing import Any

from runtime.gateway.config import RouterConfig
from runtime.gateway.consumers import Receive, Scope, Send
from runtime.gateway.errors import ApiError
from runtime.gateway.state import STATE_KEY, RouterState, build_state

logger = logging.getLogger(__name__)


def ensure_django_settings() -> None:
    """Minimal settings for Channels when nothing configured Django (the router process).

    ``CHANNEL_LAYERS = {}``: no consumer here may find a channel layer. (The consumers also
    refuse to build one whatever the settings say.) No database, no installed apps.
    """
    from django.conf import settings  # noqa: PLC0415 - only the gateway knows django.conf

    if not settings.configured:
        settings.configure(CHANNEL_LAYERS={}, USE_TZ=True, DATABASES={}, INSTALLED_APPS=[])


def http_routes() -> tuple[Any, dict[str, Any]]:
    """The Channels URLRouter of every route, and the fixed paths among them (``/v1/...``,
    no parameters) mapped straight to their consumers' ASGI apps."""
    from channels.routing import URLRouter  # noqa: PLC0415
    from django.urls import path, re_path  # noqa: PLC0415

    from runtime.gateway.batch_proxy import BatchApiConsumer  # noqa: PLC0415
    from runtime.gateway.classify import ClassificationsConsumer  # noqa: PLC0415
    from runtime.gateway.inference import (  # noqa: PLC0415
        ChatCompletionsConsumer,
        CompletionsConsumer,
        EmbeddingsConsumer,
    )
    from runtime.gateway.service import (  # noqa: PLC0415
        HealthzConsumer,
        MetricsConsumer,
        ModelsConsumer,
        NotFoundConsumer,
        ReadyzConsumer,
    )

    fixed = {
        "v1/chat/completions": ChatCompletionsConsumer.as_asgi(),
        "v1/completions": CompletionsConsumer.as_asgi(),
        "v1/embeddings": EmbeddingsConsumer.as_asgi(),
        "v1/classifications": ClassificationsConsumer.as_asgi(),
        "v1/models": ModelsConsumer.as_asgi(),
        "healthz": HealthzConsumer.as_asgi(),
        "readyz": ReadyzConsumer.as_asgi(),
        "metrics": MetricsConsumer.as_asgi(),
    }
    router = URLRouter(
        [
            *(path(route, app) for route, app in fixed.items()),
            path("v1/models/<path:model>", ModelsConsumer.as_asgi()),
            re_path(r"^v1/(?:files|batches)(?:/.*)?$", BatchApiConsumer.as_asgi()),
            re_path(r"", NotFoundConsumer.as_asgi()),
        ]
    )
    return router, {f"/{route}": app for route, app in fixed.items()}


class RouterApp:
    """A pure ASGI callable: ``lifespan`` handled here, ``http`` routed to consumers."""

    def __init__(self, config: RouterConfig) -> None:
        self.config = config
        self.http, self._fixed = http_routes()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "http":
            if STATE_KEY not in scope.get("state", {}):
                await _not_started(send)
                return
            fixed = None if scope.get("root_path") else self._fixed.get(scope["path"])
            if fixed is not None:  # what the URLRouter would do for this path, without a scan
                scope = dict(scope, path_remaining="", url_route={"args": (), "kwargs": {}})
                await fixed(scope, receive, send)
            else:
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
    ensure_django_settings()
    return RouterApp(config or RouterConfig.from_env())
