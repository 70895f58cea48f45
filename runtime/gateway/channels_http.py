"""The Channels flavour of the router's HTTP entry (``SWITCHYARD_ROUTER_HTTP=channels``).

What the router served before issue #27 settled the framework question, kept for the A/B
(``switchyard-channels`` in ``bench/targets``): every consumer of :func:`route_table` mixed
with Channels' ``AsyncHttpConsumer`` and made per request by its ``as_asgi()``, the fixed
paths called straight (as before, without the ``URLRouter``'s scan), the others through a
Channels ``URLRouter`` of ``django.urls`` paths. The consumers' own code is the same in both
flavours. Django's settings are configured minimally here (no channel layer, no database,
no installed apps); the pure ASGI flavour never imports Django.
"""

from __future__ import annotations

from typing import Any

from runtime.gateway.consumers import GatewayConsumer, Receive, Scope, Send
from runtime.gateway.routes import route_table


def ensure_django_settings() -> None:
    """Minimal settings for Channels when nothing configured Django (the router process).

    ``CHANNEL_LAYERS = {}``: no consumer here may find a channel layer. (The consumers also
    refuse to build one whatever the settings say.) No database, no installed apps.
    """
    from django.conf import settings  # noqa: PLC0415 - only the gateway knows django.conf

    if not settings.configured:
        settings.configure(CHANNEL_LAYERS={}, USE_TZ=True, DATABASES={}, INSTALLED_APPS=[])


def channels_app(consumer: type[GatewayConsumer]) -> Any:
    """``consumer`` with Channels' ``AsyncHttpConsumer`` below it, as Channels' ASGI app."""
    from channels.generic.http import AsyncHttpConsumer  # noqa: PLC0415

    mixed: Any = type(consumer.__name__, (consumer, AsyncHttpConsumer), {})
    return mixed.as_asgi()


class ChannelsHttp:
    """The Channels HTTP entry: ``await http(scope, receive, send)`` for one request."""

    def __init__(self) -> None:
        ensure_django_settings()
        from channels.routing import URLRouter  # noqa: PLC0415
        from django.urls import path, re_path  # noqa: PLC0415

        from runtime.gateway.batch_proxy import BatchApiConsumer  # noqa: PLC0415
        from runtime.gateway.service import ModelsConsumer, NotFoundConsumer  # noqa: PLC0415

        fixed = {route: channels_app(consumer) for route, consumer in route_table().items()}
        self.router = URLRouter(
            [
                *(path(route.lstrip("/"), app) for route, app in fixed.items()),
                path("v1/models/<path:model>", channels_app(ModelsConsumer)),
                re_path(r"^v1/(?:files|batches)(?:/.*)?$", channels_app(BatchApiConsumer)),
                re_path(r"", channels_app(NotFoundConsumer)),
            ]
        )
        self._fixed = fixed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        fixed = None if scope.get("root_path") else self._fixed.get(scope["path"])
        if fixed is not None:  # what the URLRouter would do for this path, without a scan
            scope = dict(scope, path_remaining="", url_route={"args": (), "kwargs": {}})
            await fixed(scope, receive, send)
        else:
            await self.router(scope, receive, send)
