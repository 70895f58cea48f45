"""Which upstream client the router uses (``SWITCHYARD_UPSTREAM_CLIENT``): a registry of the
two implementations of one contract (:class:`~runtime.upstream.client.UpstreamClient`).

``aiohttp``: aiohttp's client for everything. ``lean``: the router's own HTTP/1.1 client for
inference requests (:mod:`runtime.upstream.lean`), aiohttp's for health probes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Final

from runtime.upstream.client import ClientConfig, UpstreamClient
from runtime.upstream.lean import LeanUpstreamClient

CLIENTS: Final[Mapping[str, Callable[[ClientConfig], UpstreamClient]]] = MappingProxyType(
    {"aiohttp": UpstreamClient, "lean": LeanUpstreamClient}
)


def new_client(kind: str, config: ClientConfig | None = None) -> UpstreamClient:
    """A client of ``kind`` (a key of :data:`CLIENTS`); ValueError names the choices."""
    factory = CLIENTS.get(kind)
    if factory is None:
        raise ValueError(f"upstream client must be one of {', '.join(CLIENTS)}, got {kind!r}")
    return factory(config or ClientConfig())
