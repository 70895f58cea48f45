"""The router's HTTP routes as a pure ASGI entry: a path, a consumer class, no framework.

The default HTTP flavour (``SWITCHYARD_ROUTER_HTTP=asgi``). A request's path is looked up in
one dict of fixed paths (the inference routes, ``/v1/models``, the probes, ``/metrics``);
``/v1/models/<model>`` and ``/v1/files*`` / ``/v1/batches*`` are matched by prefix; anything
else gets the 404 consumer. The consumer is made for the request and called with the scope as
it came (no copy), except for ``/v1/models/<model>``, whose scope gains the ``url_route``
Channels' ``URLRouter`` would have set. The routes and their consumers are the same as the
Channels flavour's (:mod:`runtime.gateway.channels_http`, kept for the A/B of issue #27);
:func:`route_table` is the one list both read.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Mapping
from types import MappingProxyType

from runtime.gateway.batch_proxy import BatchApiConsumer
from runtime.gateway.classify import ClassificationsConsumer
from runtime.gateway.consumers import GatewayConsumer, Receive, Scope, Send
from runtime.gateway.inference import (
    ChatCompletionsConsumer,
    CompletionsConsumer,
    EmbeddingsConsumer,
)
from runtime.gateway.service import (
    HealthzConsumer,
    MetricsConsumer,
    ModelsConsumer,
    NotFoundConsumer,
    ReadyzConsumer,
)

MODEL_PREFIX = "/v1/models/"  # + a model id (anything non-empty, slashes included)
BATCH_PATH = re.compile(r"/v1/(?:files|batches)(?:/.*)?", re.DOTALL)


def route_table() -> Mapping[str, type[GatewayConsumer]]:
    """Every fixed path (with its leading ``/``) and the consumer that serves it."""
    return MappingProxyType(
        {
            "/v1/chat/completions": ChatCompletionsConsumer,
            "/v1/completions": CompletionsConsumer,
            "/v1/embeddings": EmbeddingsConsumer,
            "/v1/classifications": ClassificationsConsumer,
            "/v1/models": ModelsConsumer,
            "/healthz": HealthzConsumer,
            "/readyz": ReadyzConsumer,
            "/metrics": MetricsConsumer,
        }
    )


def resolve(
    fixed: Mapping[str, type[GatewayConsumer]], path: str
) -> tuple[type[GatewayConsumer], dict[str, str] | None]:
    """The consumer for ``path`` and the route's keyword arguments (None: it has none)."""
    consumer = fixed.get(path)
    if consumer is not None:
        return consumer, None
    if path.startswith(MODEL_PREFIX) and len(path) > len(MODEL_PREFIX):
        return ModelsConsumer, {"model": path[len(MODEL_PREFIX) :]}
    if BATCH_PATH.fullmatch(path):
        return BatchApiConsumer, {}
    return NotFoundConsumer, {}


class HttpRoutes:
    """The pure ASGI HTTP entry: ``await routes(scope, receive, send)`` for one request."""

    __slots__ = ("_fixed",)

    def __init__(self) -> None:
        self._fixed = route_table()

    def __call__(self, scope: Scope, receive: Receive, send: Send) -> Awaitable[None]:
        """The consumer's own coroutine (no frame of ours on every resume of the request's
        task, issue #27)."""
        path: str = scope["path"]
        root = scope.get("root_path")
        if root and path.startswith(root):
            path = path[len(root) :]
        consumer, kwargs = resolve(self._fixed, path)
        if kwargs is not None:
            scope = dict(scope, path_remaining="", url_route={"args": (), "kwargs": kwargs})
        return consumer()(scope, receive, send)
