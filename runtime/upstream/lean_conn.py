"""The lean upstream client's connections: an asyncio Protocol per keep-alive HTTP/1.1
connection whose responses httptools parses, and a bounded pool of them per endpoint.

A :class:`LeanConnection` carries one exchange at a time. Its body arrives as the chunks the
transport delivered (no stream reader, no per-read task): :class:`LeanResponse` hands them
out with ``content.readany()``, the one read :class:`~runtime.upstream.response.UpstreamResponse`
uses, bounded by the request's deadline (``TimeoutError``) and the idle cap (``ReadIdleError``).
A connection goes back to its pool only when its response was read to its end and the
worker keeps it alive; a response closed before its end (a cancelled or abandoned stream)
aborts the connection, so the engine sees the disconnect at once and the socket is never
reused. Reading stops while more than ``_HIGH_WATER`` bytes wait to be read. The pool of
an endpoint's connections is :class:`runtime.upstream.lean_pool.Pool`.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Awaitable
from typing import TYPE_CHECKING, cast

import httptools
from multidict import CIMultiDict, CIMultiDictProxy

from runtime.upstream.response import ReadIdleError

if TYPE_CHECKING:
    from runtime.upstream.lean_pool import Pool

_HIGH_WATER = 1 << 20  # bytes buffered before the transport stops reading


class DisconnectedError(ConnectionError):
    """The worker closed or broke the connection before its response ended."""


class LeanConnection(asyncio.Protocol):
    """One connection to one endpoint; see the module docstring."""

    def __init__(self, pool: Pool, loop: asyncio.AbstractEventLoop) -> None:
        self.pool = pool
        # The loop it runs on, held: Python 3.11's get_running_loop() makes a getpid syscall
        # per call, and a streamed response waits ~6 times and reads the clock ~5 times.
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._paused = False
        self._waiter: asyncio.Future[None] | None = None
        # One read timer per connection, re-armed only when it fires before the wait it
        # now bounds is due (a chunk per wait would otherwise arm and cancel one each).
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._due: float | None = None  # when the current wait fails (None: unbounded)
        self._due_error: type[TimeoutError] = TimeoutError
        self.status = 0
        self.content_type = ""
        self.headers_done = False
        self.complete = False
        self.keep_alive = False
        self.error: BaseException | None = None
        self.lost = False
        self.active = False  # an exchange is in progress (not idle in the pool)
        self.idle_since = 0.0
        self._framed = False  # content-length or chunked: the end is in the message
        self._return_when_complete = False

    # -- asyncio.Protocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if not self.active or self.complete:
            self._fail(DisconnectedError("the worker sent bytes outside a response"))
            return
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(DisconnectedError(f"malformed response from the worker: {exc}"))

    def eof_received(self) -> bool:
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._disarm()
        if self.active and not self.complete:
            if self.headers_done and not self._framed and self.error is None:
                self.complete = True  # a body delimited by the connection's end
            elif self.error is None:
                cause = exc if exc is not None else DisconnectedError("the worker hung up")
                self.error = cause
        self._wake()
        self.pool.forget(self)

    # -- httptools callbacks -----------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._raw_headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        for name, value in self._raw_headers:
            lowered = name.lower()
            if lowered == b"content-type":
                self.content_type = value.split(b";", 1)[0].strip().lower().decode("latin-1")
            elif lowered in (b"content-length", b"transfer-encoding"):
                self._framed = True
        if self.status in (204, 304) or 100 <= self.status < 200:
            self._framed = True
        self.headers_done = True
        self._wake()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > _HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self.complete = True
        self.keep_alive = self._parser.should_keep_alive()
        self._wake()
        if self._return_when_complete:
            self.finish()

    # -- the exchange --------------------------------------------------------------------
    def start(self, request: bytes) -> None:
        """Send one request (the connection is ours, idle and open)."""
        self.active = True
        self.status = 0
        self.content_type = ""
        self.headers_done = self.complete = self.keep_alive = self._framed = False
        self._return_when_complete = False
        self._raw_headers = []
        assert self.transport is not None
        self.transport.write(request)

    @property
    def reusable(self) -> bool:
        return not self.lost and self.error is None and self.transport is not None

    @property
    def raw_headers(self) -> list[tuple[bytes, bytes]]:
        return self._raw_headers

    def take(self) -> bytes:
        """Every buffered body byte (b"" when none)."""
        chunks = self._chunks
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    def has_data(self) -> bool:
        return bool(self._chunks)

    def wait(self, when: float | None, *, idle: bool) -> Awaitable[None]:
        """A future that is done when something happens on the connection (await it); at loop
        time ``when`` it fails with ReadIdleError (``idle``) or TimeoutError. The future
        itself, not a coroutine around it: one frame fewer per read (#27). It stays the
        connection's waiter once done (``_wake`` and the timer skip a done one)."""
        loop = self.loop
        waiter = self._waiter = loop.create_future()
        self._due = when
        if when is not None:
            self._due_error = ReadIdleError if idle else TimeoutError
            if self._timer is None or self._timer_at > when:
                self._arm(loop, when)
        return waiter

    def _arm(self, loop: asyncio.AbstractEventLoop, when: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._timer_at = loop.call_at(when, self._expire), when

    def _expire(self) -> None:
        """The read timer: fail the wait now due; re-arm for one due later; else lapse."""
        self._timer = None
        due, waiter = self._due, self._waiter
        if due is None or waiter is None or waiter.done():
            return
        loop = waiter.get_loop()
        if loop.time() < due:  # armed for an earlier wait: the current one is due later
            self._arm(loop, due)
        else:
            waiter.set_exception(self._due_error())

    def _disarm(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def finish(self) -> None:
        """The response was read (or is being read) to its end: back to the pool once the
        message completed with keep-alive, else closed."""
        self._disarm()
        if not self.complete and self.reusable:
            self._return_when_complete = True  # the last chunk's terminator is still coming
            self.pool.linger(self)
            return
        self.active = False
        if self.complete and self.keep_alive and self.reusable:
            self.pool.put_back(self)
        else:
            self.abort()

    def abort(self) -> None:
        """Cut the connection now (no TLS close_notify exchange, no reuse); a reader of an
        unfinished response gets DisconnectedError."""
        self._disarm()
        if self.active and not self.complete and self.error is None:
            self.error = DisconnectedError("the connection was closed by the router")
            self._wake()
        self.active = False
        self._return_when_complete = False
        if self.transport is not None:
            self.transport.abort()
        self.pool.forget(self)

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        self._wake()
        if self.transport is not None:
            self.transport.abort()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


class LeanResponse:
    """What :class:`~runtime.upstream.response.UpstreamResponse` reads of a response: status,
    headers, ``content.readany()``, ``release()`` and ``close()``."""

    __slots__ = ("_conn", "_deadline", "_idle", "_raw_headers", "closed", "content_type", "status")

    def __init__(self, conn: LeanConnection, *, deadline: float, idle: float | None) -> None:
        self._conn: LeanConnection | None = conn
        self._deadline = deadline
        self._idle = idle
        self._raw_headers: list[tuple[bytes, bytes]] = []
        self.status = 0
        self.content_type = ""
        self.closed = False

    @property
    def content(self) -> LeanResponse:
        return self

    @property
    def headers(self) -> CIMultiDictProxy[str]:
        """The response's headers (built when asked: the relay never asks)."""
        pairs = ((n.decode("latin-1"), v.decode("latin-1")) for n, v in self._raw_headers)
        return CIMultiDictProxy(CIMultiDict(pairs))

    async def send(self, request: bytes) -> None:
        """Send the request and wait for the response's head (the caller bounds the wait)."""
        conn = self._conn
        assert conn is not None
        conn.start(request)
        while not conn.headers_done:
            if conn.error is not None:
                raise conn.error
            await conn.wait(None, idle=False)
        self.status = conn.status
        self.content_type = conn.content_type
        self._raw_headers = conn.raw_headers

    def at_end(self) -> bool:
        conn = self._conn
        return conn is None or (conn.complete and not conn.has_data())

    async def readany(self) -> bytes:
        """The body bytes received since the last read; b"" at the end of the body."""
        conn = self._conn
        if conn is None:
            raise DisconnectedError("the response is closed")
        while True:
            if conn._chunks:  # has_data() inline: one call per read fewer (#27)
                return conn.take()
            if conn.error is not None:
                raise conn.error
            if conn.complete:
                return b""
            loop_now = conn.loop.time()
            idle_at = None if self._idle is None else loop_now + self._idle
            if idle_at is not None and idle_at < self._deadline:
                await conn.wait(idle_at, idle=True)
            else:
                await conn.wait(self._deadline, idle=False)

    async def read(self, cap: int | None = None) -> bytes:
        """The rest of the body (at most ``cap`` bytes: then the connection is not reused)."""
        parts: list[bytes] = []
        size = 0
        while cap is None or size < cap:
            chunk = await self.readany()
            if not chunk:
                break
            parts.append(chunk)
            size += len(chunk)
        data = b"".join(parts)
        return data if cap is None else data[:cap]

    def release(self) -> None:
        """Done with the response: its connection goes back to the pool when its message
        ends (now or at the terminator still in flight), else it is closed."""
        conn, self._conn = self._conn, None
        self.closed = True
        if conn is not None:
            conn.finish()

    def close(self) -> None:
        """Abandon the response: the connection is cut, never reused."""
        conn, self._conn = self._conn, None
        self.closed = True
        if conn is not None:
            conn.abort()
