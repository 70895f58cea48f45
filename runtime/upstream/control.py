"""The router's HTTP client to the control plane (the Batch API's files and batches).

One aiohttp session (its own pool, apart from the workers' pools). :meth:`ControlPlaneClient.
forward` sends one request and returns the status, the headers worth passing back and the
whole body; a control plane that cannot be reached, or does not answer within ``timeout_s``,
raises :class:`~runtime.upstream.errors.ConnectFailed` or
:class:`~runtime.upstream.errors.FirstByteTimeout`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from runtime.upstream.client import join_url
from runtime.upstream.errors import ConnectFailed, FirstByteTimeout

PASSED_BACK = frozenset({"content-type", "content-disposition"})


@dataclass(frozen=True, slots=True)
class Forwarded:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


class ControlPlaneClient:
    """Create it in the router's lifespan; ``await close()`` at exit."""

    def __init__(self, base_url: str, *, timeout_s: float = 60.0) -> None:
        self.base_url = base_url
        self.timeout_s = timeout_s
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=64, keepalive_timeout=4.0),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def forward(
        self, method: str, path: str, *, query: str, headers: Mapping[str, str], body: bytes
    ) -> Forwarded:
        url = join_url(self.base_url, path) + (f"?{query}" if query else "")
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with self._open().request(
                method, url, data=body or None, headers=dict(headers), timeout=timeout
            ) as resp:
                data = await resp.read()
                kept = [(k.lower(), v) for k, v in resp.headers.items() if k.lower() in PASSED_BACK]
                return Forwarded(resp.status, kept, data)
        except TimeoutError as exc:
            raise FirstByteTimeout(f"the control plane did not answer: {exc!r}") from exc
        except (aiohttp.ClientError, OSError) as exc:
            raise ConnectFailed(f"cannot reach the control plane: {exc!r}") from exc

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
