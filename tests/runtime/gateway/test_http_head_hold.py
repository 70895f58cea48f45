"""A response's head on a plain HTTP connection (our uvicorn protocol, issue #27): it goes out
with the body's first write of the same event-loop turn, as one socket write, and the rest of
the response as uvicorn writes it; a head whose body comes on a later turn goes out alone on
the next turn (the client sees it before the body exists). uvicorn serving on this loop, the
socket's writes counted (the unit tests of :class:`HeadHold` are in ``test_coalesce``)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import pytest
import uvicorn
from fixtures.net import free_port
from fixtures.wait import async_eventually

from runtime.gateway.http_protocol import BoundedHttpToolsProtocol

REQUEST = b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n"


class CountedWrites(asyncio.Transport):
    """The socket's transport (asyncio's), with what the server writes to it recorded."""

    def __init__(self, transport: asyncio.Transport, writes: list[bytes]) -> None:
        super().__init__()
        self._transport = transport
        self.writes = writes

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        self._transport.write(data)

    def close(self) -> None:
        self._transport.close()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size()


@contextlib.asynccontextmanager
async def server(app: Any, writes: list[bytes]) -> AsyncIterator[int]:
    class Counted(BoundedHttpToolsProtocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(CountedWrites(transport, writes))

    port = free_port()
    served = uvicorn.Server(
        uvicorn.Config(
            app, host="127.0.0.1", port=port, loop="none", http=Counted, lifespan="off",
            log_config=None, access_log=False,
        )
    )  # fmt: skip
    task = asyncio.create_task(served.serve())
    try:
        await async_eventually(lambda: served.started or task.done(), timeout=20)
        yield port
    finally:
        served.should_exit = True
        async with asyncio.timeout(20):
            await task


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_stream_head_and_first_event_are_one_socket_write() -> None:
    later = asyncio.Event()

    async def stream(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})  # fmt: skip
        await send({"type": "http.response.body", "body": b"data: 1\n\n", "more_body": True})
        await later.wait()  # a later turn
        await send({"type": "http.response.body", "body": b"data: 2\n\n", "more_body": False})

    writes: list[bytes] = []
    async with server(stream, writes) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(REQUEST)
        async with asyncio.timeout(10):
            first = await reader.readuntil(b"data: 1\n\n\r\n")
            later.set()
            rest = await reader.readuntil(b"0\r\n\r\n")
        writer.close()
    assert first.startswith(b"HTTP/1.1 200 OK\r\n")
    assert b"content-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n" in first
    assert rest == b"9\r\ndata: 2\n\n\r\n0\r\n\r\n"
    assert writes == [first, rest]  # head + first event: one write


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_head_whose_body_comes_later_is_sent_alone_first() -> None:
    body_may_come = asyncio.Event()

    async def slow(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"2")]})  # fmt: skip
        await body_may_come.wait()  # set only once the client has read the head
        await send({"type": "http.response.body", "body": b"ok"})

    writes: list[bytes] = []
    async with server(slow, writes) as port:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(REQUEST)
        async with asyncio.timeout(10):
            head = await reader.readuntil(b"\r\n\r\n")
            body_may_come.set()
            body = await reader.readexactly(2)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200 OK\r\n")
    assert body == b"ok"
    assert writes == [head, b"ok"]
