"""One-off requests to workers, read to their end and dropped: shadow copies of live requests
(:mod:`runtime.routing.shadow`) and throughput measurements (:mod:`runtime.scaling.measure`).

Off the request path, so none of the inference machinery applies (no breaker, no retry, no
endpoint snapshot needed): :meth:`DrainClient.post` sends one body to a URL, reads the answer
to its end within ``timeout_s`` keeping nothing but its shape (:class:`Drained`: the status,
the seconds to the response headers and to the first streamed event, the number of events),
on a pool of its own, never the router's inference pools.

Failures are classified like the rest of :mod:`runtime.upstream`: before the response headers
``post`` raises :class:`~runtime.upstream.errors.ConnectFailed` (no connection),
:class:`~runtime.upstream.errors.DeadlineExceeded` (``timeout_s`` passed) or
:class:`~runtime.upstream.errors.ConnectionDropped`; after them what arrived stands and the
failure is :attr:`Drained.broken` (a :class:`~runtime.upstream.errors.StreamBroken`,
``"deadline"`` or ``"disconnected"``).
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass

import aiohttp

from runtime.upstream.errors import (
    ConnectFailed,
    ConnectionDropped,
    DeadlineExceeded,
    StreamBroken,
    UpstreamError,
)
from runtime.upstream.sse import DONE, SSEDecoder

_JSON_HEADERS = {"Content-Type": "application/json"}


@dataclass(frozen=True, slots=True)
class Drained:
    """What a drained answer looked like. Times are seconds since the request was sent."""

    status: int
    headers_s: float  # to the status line and headers
    total_s: float  # to the end of the body (or the failure)
    first_event_s: float | None = None  # to the first data event of a stream; None: none
    events: int = 0  # data events of a stream, ``[DONE]`` left out
    broken: StreamBroken | None = None  # the body failed after the headers


class DrainClient:
    """A small pool for one-off requests; ``await close()`` when done. Not thread-safe."""

    def __init__(
        self, *, timeout_s: float = 60.0, limit: int = 100, tls: ssl.SSLContext | None = None
    ) -> None:
        if not timeout_s > 0 or limit < 1:
            raise ValueError("timeout_s must be > 0 and limit >= 1")
        self.timeout_s = timeout_s
        self._limit = limit
        self._tls = tls  # https:// workers (runtime.tls.upstream_context); None: the defaults
        self._session: aiohttp.ClientSession | None = None
        self._closed = False

    def _open(self) -> aiohttp.ClientSession:
        if self._closed:
            raise RuntimeError("DrainClient is closed")
        if self._session is None:
            # No cookie jar: a worker's cookies must not follow one request into the next.
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._limit, ssl=self._tls or True),
                cookie_jar=aiohttp.DummyCookieJar(),
            )
        return self._session

    async def post(
        self, url: str, body: bytes, *, headers: Mapping[str, str] | None = None
    ) -> Drained:
        """POST ``body`` to ``url`` and read the answer to its end (see the module doc)."""
        session = self._open()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout_s
        started = time.perf_counter()
        try:
            async with asyncio.timeout_at(deadline):
                resp = await session.post(
                    url, data=body, headers={**_JSON_HEADERS, **(headers or {})}
                )
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _classify(exc, url) from exc
        headers_s = time.perf_counter() - started
        decoder = SSEDecoder() if resp.content_type == "text/event-stream" else None
        first_event_s: float | None = None
        events = 0
        broken: StreamBroken | None = None
        try:
            async with asyncio.timeout_at(deadline):
                async for chunk in resp.content.iter_any():
                    if decoder is None:
                        continue  # read to the end, keep nothing
                    for data in decoder.feed(chunk):
                        if data != DONE:
                            events += 1
                            if first_event_s is None:
                                first_event_s = time.perf_counter() - started
        except TimeoutError:
            broken = StreamBroken(f"{url}: timed out reading the answer", reason="deadline")
        except (aiohttp.ClientError, OSError) as exc:
            broken = StreamBroken(f"{url}: answer cut short: {exc!r}", reason="disconnected")
        finally:
            if broken is None and resp.content.is_eof():
                resp.release()
            else:
                resp.close()  # cut: the worker sees the disconnect
        return Drained(
            status=resp.status, headers_s=headers_s, total_s=time.perf_counter() - started,
            first_event_s=first_event_s, events=events, broken=broken,
        )  # fmt: skip

    async def close(self) -> None:
        """Close the pool (requests in flight are cut). Idempotent."""
        self._closed = True
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _classify(exc: BaseException, url: str) -> UpstreamError:
    """An aiohttp/OS failure before the response headers, as the upstream hierarchy has it."""
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        return ConnectFailed(f"{url}: cannot connect: {exc}")
    if isinstance(exc, TimeoutError):
        return DeadlineExceeded(f"{url}: no answer within the timeout")
    return ConnectionDropped(f"{url}: connection failed before the answer: {exc!r}")
