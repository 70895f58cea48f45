"""The HTTP client to workers: one aiohttp session and connection pool per endpoint URL.

:meth:`UpstreamClient.open_stream` makes one attempt and returns once the first byte has
arrived: the status line and, for a stream, its first event (vLLM sends its headers before
prefill, so the first event is what marks time to first token); for a unary answer, its
whole body. Every failure before that point is raised as a classified
:class:`~runtime.upstream.errors.UpstreamError` and the connection is closed; retrying is
the dispatcher's job. Health probes use a separate small pool so a saturated inference
pool never delays them. Workers at ``https://`` URLs are called with
:attr:`ClientConfig.tls` (:func:`runtime.tls.upstream_context`: the CA that signs them and the
router's client certificate for mTLS); a handshake that fails is a
:class:`~runtime.upstream.errors.ConnectFailed` saying which side refused which certificate.
"""

from __future__ import annotations

import asyncio
import errno
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field

import aiohttp
from yarl import URL

from runtime.snapshot import EndpointSnap
from runtime.upstream.errors import (
    ConnectFailed,
    ConnectionDropped,
    DeadlineExceeded,
    FirstByteTimeout,
    UpstreamError,
    UpstreamHTTPError,
)
from runtime.upstream.response import RawResponse, UpstreamResponse
from runtime.upstream.sse import SSEDecoder
from runtime.upstream.timeouts import TimeoutPolicy, attempt_timeouts

_JSON_HEADERS = {"Content-Type": "application/json"}
_CHECK_CLIENT_CERT = (
    "check SWITCHYARD_UPSTREAM_TLS_CERT/KEY against the worker's SWITCHYARD_WORKER_TLS_CLIENT_CA"
)
TLS_HANG_UP = (
    "TLS: the worker hung up before answering; a worker that requires client certificates "
    f"does so when ours is missing or not signed by its CA: {_CHECK_CLIENT_CERT}"
)
_CLOCK_SLACK = 0.001  # loop timers may fire a hair before their time


@dataclass(frozen=True, slots=True)
class ClientConfig:
    limit_per_host: int = 256  # connections per endpoint; at least the endpoint's capacity
    # Below the 5 s keep-alive of uvicorn (vLLM's server), so we never reuse a socket the
    # server is closing.
    keepalive_s: float = 4.0
    timeouts: TimeoutPolicy = field(default_factory=TimeoutPolicy)
    max_error_body: int = 64 * 1024
    max_probe_body: int = 8 * 1024 * 1024
    probe_limit_per_host: int = 2
    tls: ssl.SSLContext | None = None  # https:// workers; None: the system's CAs, no client cert


def join_url(base_url: str, path: str) -> str:
    return base_url.rstrip("/") + "/" + path.lstrip("/")


class UpstreamClient:
    """Owns the connection pools; create it in the app's lifespan, ``await close()`` at exit."""

    def __init__(self, config: ClientConfig | None = None) -> None:
        self.config = config or ClientConfig()
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        # Each endpoint's URL of a path, parsed once (aiohttp parses a string per request).
        self._urls: dict[tuple[str, str], URL] = {}
        self._probe_session: aiohttp.ClientSession | None = None
        self._closed = False

    def _session(self, base_url: str) -> aiohttp.ClientSession:
        key = base_url.rstrip("/")
        session = self._sessions.get(key)
        if session is None:
            if self._closed:
                raise RuntimeError("UpstreamClient is closed")
            connector = aiohttp.TCPConnector(
                limit=0,
                limit_per_host=self.config.limit_per_host,
                keepalive_timeout=self.config.keepalive_s,
                ssl=self.config.tls or True,
            )
            # No cookie jar: a worker's cookies must never follow one tenant's request into
            # another's, and filtering an empty jar is work on every request. The JSON
            # content type is the session's (not merged into a new dict per request).
            session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), headers=_JSON_HEADERS
            )
            self._sessions[key] = session
        return session

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
        """POST ``body`` to the endpoint; return at the first byte or raise UpstreamError.

        ``deadline`` is absolute on the loop clock. ``first_byte_cap`` overrides the policy's
        TTFT cap (pass ``math.inf`` for a unary request).
        """
        loop = asyncio.get_running_loop()
        start = loop.time()
        timeouts = attempt_timeouts(
            self.config.timeouts, deadline=deadline, now=start, first_byte_cap=first_byte_cap
        )
        session = self._session(endpoint.base_url)
        url = self._urls.get((endpoint.base_url, path))
        if url is None:
            url = self._urls[endpoint.base_url, path] = URL(join_url(endpoint.base_url, path))
        eid = endpoint.id
        resp: aiohttp.ClientResponse | None = None
        try:
            async with asyncio.timeout_at(start + timeouts.first_byte):
                resp = await session.post(
                    url, data=body, headers=headers, timeout=timeouts.client_timeout()
                )
                await self._raise_for_status(resp, eid)
                if resp.content_type == "text/event-stream":
                    decoder = SSEDecoder()
                    first = await _first_events(resp, decoder, eid)
                    return UpstreamResponse(
                        resp, endpoint_id=eid, decoder=decoder, first_events=first
                    )
                data = await resp.read()
                return UpstreamResponse(resp, endpoint_id=eid, body=data)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            _discard(resp)
            raise _classify(
                exc, eid, deadline=deadline, now=loop.time(), tls=url.scheme == "https"
            ) from exc
        except BaseException:
            _discard(resp)
            raise

    async def _raise_for_status(self, resp: aiohttp.ClientResponse, eid: int) -> None:
        if 200 <= resp.status < 300:
            return
        try:
            body = await _read_capped(resp, self.config.max_error_body)
        except (aiohttp.ClientError, OSError):
            body = b""  # the status alone is the verdict
        raise UpstreamHTTPError(resp.status, body, endpoint_id=eid, content_type=resp.content_type)

    async def probe(self, base_url: str, path: str, *, timeout_s: float) -> tuple[int, bytes]:
        """GET ``path`` (health, metrics) within ``timeout_s``; the status and capped body."""
        if self._closed:
            raise RuntimeError("UpstreamClient is closed")
        if self._probe_session is None:
            connector = aiohttp.TCPConnector(
                limit=0,
                limit_per_host=self.config.probe_limit_per_host,
                keepalive_timeout=self.config.keepalive_s,
                ssl=self.config.tls or True,
            )
            self._probe_session = aiohttp.ClientSession(connector=connector)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        try:
            async with (
                asyncio.timeout_at(deadline),
                self._probe_session.get(join_url(base_url, path)) as resp,
            ):
                return resp.status, await _read_capped(resp, self.config.max_probe_body)
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            raise _classify(
                exc, None, deadline=deadline, now=loop.time(), tls=base_url.startswith("https:")
            ) from exc

    async def close(self) -> None:
        """Close every pool (in-flight responses are cut). Idempotent."""
        self._closed = True
        sessions = list(self._sessions.values())
        if self._probe_session is not None:
            sessions.append(self._probe_session)
        self._sessions.clear()
        self._probe_session = None
        for session in sessions:
            await session.close()


def _discard(resp: aiohttp.ClientResponse | None) -> None:
    if resp is None:
        return
    if resp.content.is_eof():
        resp.release()  # fully read (an error body): the connection can be reused
    else:
        resp.close()


async def _read_capped(resp: aiohttp.ClientResponse, cap: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while size < cap:
        chunk = await resp.content.read(cap - size)
        if not chunk:
            break
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)


async def _first_events(resp: RawResponse, decoder: SSEDecoder, eid: int) -> list[bytes]:
    while True:
        chunk = await resp.content.readany()
        if not chunk:
            raise ConnectionDropped("stream ended before its first event", endpoint_id=eid)
        events = decoder.feed(chunk)
        if events:
            return events


def _classify(
    exc: BaseException, eid: int | None, *, deadline: float, now: float, tls: bool = False
) -> UpstreamError:
    """Map an aiohttp/OS failure before the first byte onto our hierarchy."""
    if isinstance(exc, TimeoutError) and now >= deadline - _CLOCK_SLACK:
        return DeadlineExceeded("deadline passed before the first byte", endpoint_id=eid)
    tls_problem = tls_failure(exc)
    if tls_problem is not None:
        return ConnectFailed(tls_problem, endpoint_id=eid)
    if isinstance(exc, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
        return ConnectFailed(f"cannot connect: {exc}", endpoint_id=eid)
    if isinstance(exc, TimeoutError):
        return FirstByteTimeout("no first byte within the TTFT cap", endpoint_id=eid)
    if tls and _hung_up(exc):
        # TLS 1.3: a worker that requires client certificates checks ours after the
        # handshake and hangs up (a clean close or a reset, by timing); its alert rarely
        # reaches aiohttp.
        return ConnectionDropped(TLS_HANG_UP, endpoint_id=eid)
    return ConnectionDropped(f"connection failed before the first byte: {exc!r}", endpoint_id=eid)


def _hung_up(exc: BaseException) -> bool:
    """The peer closed or reset the connection before answering."""
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return True
    return isinstance(exc, aiohttp.ClientOSError) and exc.errno == errno.ECONNRESET


def _ssl_error(exc: BaseException) -> ssl.SSLError | None:
    """The ssl error behind ``exc`` (aiohttp wraps it; under TLS 1.3 a refused client
    certificate surfaces at the first read, as an OSError around it), or None."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, ssl.SSLError):
            return seen
        inner = getattr(seen, "os_error", None)
        seen = inner if isinstance(inner, BaseException) else (seen.__cause__ or seen.__context__)
    return None


def tls_failure(exc: BaseException) -> str | None:
    """An operator's sentence for a failed TLS handshake with a worker; None: not TLS."""
    if isinstance(exc, aiohttp.ClientConnectorCertificateError):
        return (
            f"TLS: the worker {exc.host}:{exc.port} presented a certificate we do not trust "
            f"({exc.certificate_error}); check SWITCHYARD_UPSTREAM_TLS_CA and the worker's "
            "certificate"
        )
    error = _ssl_error(exc)
    if error is None:
        return None
    return (
        f"TLS handshake with the worker failed ({error.reason or error}); a worker that "
        f"requires client certificates refuses an untrusted one, or none: {_CHECK_CLIENT_CERT}"
    )
