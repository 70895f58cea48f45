"""The lean upstream client (``SWITCHYARD_UPSTREAM_CLIENT=lean``): inference requests over
our own HTTP/1.1 connections (:mod:`runtime.upstream.lean_conn`) instead of aiohttp's.

Same contract as :class:`~runtime.upstream.client.UpstreamClient`, which it extends:
:meth:`LeanUpstreamClient.open_stream` returns an
:class:`~runtime.upstream.response.UpstreamResponse` at the first byte or raises the same
classified errors; health probes (:meth:`probe`) stay on the base class's aiohttp pool,
unchanged. What it saves per request: the request head is one bytes join of a prefix
prepared per endpoint and path (method, path, host, content type), the Content-Length and
the request's few headers; no request/response objects of a general client, no stream
reader, no cookie or redirect handling, no task per read. Connections per endpoint are
capped at :attr:`ClientConfig.limit_per_host`, kept alive for ``keepalive_s``; https
endpoints use :attr:`ClientConfig.tls` (or the system's CAs), as the aiohttp path does.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections.abc import Mapping
from urllib.parse import urlsplit

from runtime.snapshot import EndpointSnap
from runtime.upstream.client import (
    TLS_HANG_UP,
    ClientConfig,
    UpstreamClient,
    _first_events,  # the aiohttp path's, on any RawResponse
    join_url,
    tls_failure,
)
from runtime.upstream.errors import (
    ConnectFailed,
    ConnectionDropped,
    DeadlineExceeded,
    FirstByteTimeout,
    UpstreamError,
    UpstreamHTTPError,
)
from runtime.upstream.lean_conn import DisconnectedError, LeanResponse
from runtime.upstream.lean_pool import ConnectTimeoutError, Pool
from runtime.upstream.response import UpstreamResponse
from runtime.upstream.sse import SSEDecoder
from runtime.upstream.timeouts import attempt_timeouts

_CLOCK_SLACK = 0.001  # loop timers may fire a hair before their time
_FORBIDDEN = frozenset("\r\n\0")


class _Endpoint:
    """One endpoint's pool and the prepared heads of the paths it was asked for."""

    __slots__ = ("heads", "pool", "tls")

    def __init__(self, pool: Pool, *, tls: bool) -> None:
        self.pool = pool
        self.tls = tls
        self.heads: dict[str, bytes] = {}


class _ConnectError(Exception):
    """A failure while connecting (TCP or TLS), before the request was sent."""

    def __init__(self, cause: BaseException, where: str) -> None:
        super().__init__(f"Cannot connect to host {where} [{_reason(cause)}]")
        self.cause = cause
        self.where = where


class LeanUpstreamClient(UpstreamClient):
    """See the module docstring; create it in the app's lifespan, ``await close()`` at exit."""

    def __init__(self, config: ClientConfig | None = None) -> None:
        super().__init__(config)
        self._endpoints: dict[str, _Endpoint] = {}
        self._default_tls: ssl.SSLContext | None = None

    def _endpoint(self, base_url: str) -> _Endpoint:
        found = self._endpoints.get(base_url)
        if found is not None:
            return found
        if self._closed:
            raise RuntimeError("UpstreamClient is closed")
        parts = urlsplit(base_url)
        secure = parts.scheme == "https"
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) endpoint URL: {base_url!r}")
        context = None
        if secure:
            context = self.config.tls or self._system_tls()
        pool = Pool(
            parts.hostname,
            parts.port or (443 if secure else 80),
            tls=context,
            limit=self.config.limit_per_host,
            keepalive_s=self.config.keepalive_s,
        )
        found = self._endpoints[base_url] = _Endpoint(pool, tls=secure)
        return found

    def pool(self, base_url: str) -> Pool | None:
        """The endpoint's connection pool, once a request was sent to it."""
        target = self._endpoints.get(base_url)
        return None if target is None else target.pool

    def _system_tls(self) -> ssl.SSLContext:
        if self._default_tls is None:
            self._default_tls = ssl.create_default_context()
        return self._default_tls

    def _head(self, base_url: str, target: _Endpoint, path: str) -> bytes:
        head = target.heads.get(path)
        if head is None:
            parts = urlsplit(join_url(base_url, path))
            request_target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
            host = parts.netloc.rsplit("@", 1)[-1]
            head = target.heads[path] = (
                f"POST {request_target} HTTP/1.1\r\nHost: {host}\r\n"
                "Content-Type: application/json\r\nContent-Length: "
            ).encode()
        return head

    async def open_stream(
        self,
        endpoint: EndpointSnap,
        path: str,
        body: bytes,
        *,
        deadline: float,
        headers: Mapping[str, str] | None = None,
        first_byte_cap: float | None = None,
    ) -> UpstreamResponse:
        """POST ``body`` to the endpoint; return at the first byte or raise UpstreamError
        (the contract of :meth:`UpstreamClient.open_stream`)."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        timeouts = attempt_timeouts(
            self.config.timeouts, deadline=deadline, now=start, first_byte_cap=first_byte_cap
        )
        target = self._endpoint(endpoint.base_url)
        request = _request(self._head(endpoint.base_url, target, path), body, headers)
        eid = endpoint.id
        pool = target.pool
        resp: LeanResponse | None = None
        try:
            async with asyncio.timeout_at(start + timeouts.first_byte):
                try:
                    conn = await pool.acquire(timeouts.connect)
                except (OSError, ssl.SSLError) as exc:
                    if isinstance(exc, ConnectTimeoutError):
                        raise
                    raise _ConnectError(exc, f"{pool.host}:{pool.port}") from exc
                resp = LeanResponse(conn, deadline=start + timeouts.total, idle=timeouts.idle)
                await resp.send(request)
                if not 200 <= resp.status < 300:
                    await self._raise_http_error(resp, eid)
                if resp.content_type == "text/event-stream":
                    decoder = SSEDecoder()
                    first = await _first_events(resp, decoder, eid)
                    return UpstreamResponse(
                        resp, endpoint_id=eid, decoder=decoder, first_events=first
                    )
                data = await resp.read()
                return UpstreamResponse(resp, endpoint_id=eid, body=data)
        except (OSError, ssl.SSLError, _ConnectError) as exc:
            _discard(resp)
            raise _classify(exc, eid, deadline=deadline, now=loop.time(), tls=target.tls) from exc
        except BaseException:
            _discard(resp)
            raise

    async def _raise_http_error(self, resp: LeanResponse, eid: int) -> None:
        status, content_type = resp.status, resp.content_type
        try:
            body = await resp.read(self.config.max_error_body)
        except OSError:
            body = b""  # the status alone is the verdict
        raise UpstreamHTTPError(status, body, endpoint_id=eid, content_type=content_type)

    async def close(self) -> None:
        """Cut every connection (in-flight responses fail) and close the probe pool."""
        self._closed = True
        endpoints = list(self._endpoints.values())
        self._endpoints.clear()
        for target in endpoints:
            target.pool.close()
        await super().close()


def _request(head: bytes, body: bytes, headers: Mapping[str, str] | None) -> bytes:
    length = str(len(body)).encode("ascii")
    if not headers:
        return b"".join((head, length, b"\r\n\r\n", body))
    lines = []
    for name, value in headers.items():
        if _FORBIDDEN.intersection(name) or _FORBIDDEN.intersection(value):
            raise ValueError(f"a newline or NUL in the upstream header {name!r}")
        lines.append(f"{name}: {value}\r\n")
    return b"".join((head, length, b"\r\n", "".join(lines).encode("utf-8"), b"\r\n", body))


def _discard(resp: LeanResponse | None) -> None:
    if resp is None:
        return
    if resp.at_end():
        resp.release()  # fully read (an error body): the connection can be reused
    else:
        resp.close()


def _classify(
    exc: BaseException, eid: int | None, *, deadline: float, now: float, tls: bool
) -> UpstreamError:
    """Map a failure before the first byte onto our hierarchy, as the aiohttp path does:
    the same classes and, for TLS, the same sentences."""
    if isinstance(exc, TimeoutError) and now >= deadline - _CLOCK_SLACK:
        return DeadlineExceeded("deadline passed before the first byte", endpoint_id=eid)
    tls_problem = _tls_problem(exc)
    if tls_problem is not None:
        return ConnectFailed(tls_problem, endpoint_id=eid)
    if isinstance(exc, _ConnectError | ConnectTimeoutError):
        return ConnectFailed(f"cannot connect: {exc}", endpoint_id=eid)
    if isinstance(exc, TimeoutError):
        return FirstByteTimeout("no first byte within the TTFT cap", endpoint_id=eid)
    if tls and _hung_up(exc):
        return ConnectionDropped(TLS_HANG_UP, endpoint_id=eid)
    return ConnectionDropped(f"connection failed before the first byte: {exc!r}", endpoint_id=eid)


def _tls_problem(exc: BaseException) -> str | None:
    if not isinstance(exc, _ConnectError):
        return tls_failure(exc)
    cause = exc.cause
    if isinstance(cause, ssl.SSLCertVerificationError):
        return (
            f"TLS: the worker {exc.where} presented a certificate we do not trust ({cause}); check "
            "SWITCHYARD_UPSTREAM_TLS_CA and the worker's certificate"
        )
    return tls_failure(cause)


def _hung_up(exc: BaseException) -> bool:
    """The peer closed or reset the connection before answering."""
    if isinstance(exc, DisconnectedError) and not isinstance(exc.__cause__, ssl.SSLError):
        return True
    return isinstance(exc, OSError) and exc.errno == errno.ECONNRESET


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
