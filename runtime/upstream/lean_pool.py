"""The lean upstream client's pool of keep-alive connections to one endpoint
(:class:`~runtime.upstream.lean_conn.LeanConnection`), bounded like aiohttp's
``limit_per_host``: at most ``limit`` connections open, idle ones reused most recent first
while younger than ``keepalive_s`` (below the worker's own keep-alive, so a socket the worker
is closing is never reused), acquirers beyond the limit served first come, first served.
"""

from __future__ import annotations

import asyncio
import collections
import ssl

from runtime.upstream.lean_conn import DisconnectedError, LeanConnection


class ConnectTimeoutError(TimeoutError):
    """No connection (TCP and TLS handshake) within the attempt's connect timeout."""


class Pool:
    """Keep-alive connections to one endpoint, at most ``limit`` open (idle, busy or
    connecting); an acquire beyond that waits its turn (first come, first served)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        tls: ssl.SSLContext | None,
        limit: int,
        keepalive_s: float,
    ) -> None:
        self.host = host
        self.port = port
        self.tls = tls
        self.limit = limit
        self.keepalive_s = keepalive_s
        self._idle: list[LeanConnection] = []
        self._open: set[LeanConnection] = set()
        self._lingering: dict[LeanConnection, asyncio.TimerHandle] = {}
        self._waiters: collections.deque[asyncio.Future[None]] = collections.deque()

    @property
    def open_count(self) -> int:
        return len(self._open)

    @property
    def idle_count(self) -> int:
        return len(self._idle)

    @property
    def waiting(self) -> int:
        """Acquirers waiting for a connection (the pool is at its limit)."""
        return sum(1 for waiter in self._waiters if not waiter.done())

    async def acquire(self, connect_timeout: float) -> LeanConnection:
        """An open connection for one exchange: the most recently idle one still fresh, or a
        new one (TCP, then TLS for an https endpoint) within ``connect_timeout``."""
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            while self._idle:
                conn = self._idle.pop()
                if conn.reusable and now - conn.idle_since < self.keepalive_s:
                    return conn
                conn.abort()
            if len(self._open) < self.limit:
                break
            waiter = loop.create_future()
            self._waiters.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    self._wake_one()  # our turn came as we left: pass it on
                else:
                    self._waiters.remove(waiter)
                raise
        conn = LeanConnection(self, loop)
        self._open.add(conn)
        try:
            await self._connect(conn, connect_timeout)
        except BaseException:
            conn.abort()
            raise
        return conn

    async def _connect(self, conn: LeanConnection, limit_s: float) -> None:
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(limit_s):
                if self.tls is None:
                    transport, _ = await loop.create_connection(lambda: conn, self.host, self.port)
                else:
                    transport, _ = await loop.create_connection(
                        lambda: conn,
                        self.host,
                        self.port,
                        ssl=self.tls,
                        server_hostname=self.host,
                        ssl_handshake_timeout=limit_s,
                        # close() is not awaited for close_notify: a short wait at most
                        ssl_shutdown_timeout=1.0,
                    )
            conn.connection_made(transport)  # uvloop calls it a loop turn later
        except TimeoutError as exc:
            raise ConnectTimeoutError(
                f"Connection timeout to host {self.host}:{self.port} after {limit_s:g}s"
            ) from exc

    def put_back(self, conn: LeanConnection) -> None:
        self._unlinger(conn)
        if conn not in self._open:
            return
        conn.idle_since = conn.loop.time()
        self._idle.append(conn)
        self._wake_one()

    def linger(self, conn: LeanConnection) -> None:
        """``conn`` waits for its message's end; cut it if that takes the keep-alive time."""
        handle = conn.loop.call_later(self.keepalive_s, conn.abort)
        self._lingering[conn] = handle

    def forget(self, conn: LeanConnection) -> None:
        """``conn`` is closed: its slot is free (idempotent)."""
        self._unlinger(conn)
        if conn in self._open:
            self._open.discard(conn)
            if conn in self._idle:
                self._idle.remove(conn)
            self._wake_one()

    def close(self) -> None:
        """Cut every connection (in-flight responses fail as disconnected)."""
        for conn in list(self._open):
            conn.abort()
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(DisconnectedError("the upstream client is closed"))
        self._waiters.clear()

    def _unlinger(self, conn: LeanConnection) -> None:
        handle = self._lingering.pop(conn, None)
        if handle is not None:
            handle.cancel()

    def _wake_one(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
