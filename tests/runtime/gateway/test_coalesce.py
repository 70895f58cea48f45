"""CoalescingTransport: the writes of one event-loop turn reach the socket as one write, in
order, on the loop's next turn; close and write_eof send what is kept, abort drops it; a
closing transport gets nothing more. Then over a real TLS connection: a server writing an
event at a time sends one TLS record per turn, and the client reads the same bytes."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path
from typing import Any

import pytest

from config.tls import ensure_local_pki
from runtime.gateway.coalesce import CoalescingTransport
from runtime.tls import ClientTLS, ServerTLS

pytestmark = pytest.mark.unit


class Recording(asyncio.Transport):
    """asyncio's transport interface, recording what it is asked to do."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[bytes] = []
        self.calls: list[str] = []
        self.closing = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self.calls.append("close")
        self.closing = True

    def write_eof(self) -> None:
        self.calls.append("write_eof")

    def abort(self) -> None:
        self.calls.append("abort")
        self.closing = True

    def get_write_buffer_size(self) -> int:
        return 7

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return {"peername": ("127.0.0.1", 1)}.get(name, default)


async def next_turn() -> None:
    await asyncio.sleep(0)


@pytest.mark.asyncio
async def test_one_turns_writes_are_one_write_on_the_next_turn() -> None:
    raw = Recording()
    transport = CoalescingTransport(raw, asyncio.get_running_loop())
    transport.write(b"HTTP/1.1 200 OK\r\n\r\n")
    transport.write(b"")  # nothing: no empty write either
    transport.write(bytearray(b"data: 1\n\n"))
    transport.writelines([b"data: 2\n\n", memoryview(b"data: [DONE]\n\n")])
    assert raw.writes == []
    assert transport.get_write_buffer_size() == 7 + 19 + 9 + 9 + 14
    await next_turn()
    assert raw.writes == [b"HTTP/1.1 200 OK\r\n\r\ndata: 1\n\ndata: 2\n\ndata: [DONE]\n\n"]
    transport.write(b"next")
    await next_turn()
    assert raw.writes[1:] == [b"next"]  # a turn with one write: as it was
    assert transport.get_extra_info("peername") == ("127.0.0.1", 1)


@pytest.mark.asyncio
async def test_close_and_write_eof_send_what_is_kept_first_abort_drops_it() -> None:
    loop = asyncio.get_running_loop()
    raw = Recording()
    transport = CoalescingTransport(raw, loop)
    transport.write(b"a")
    transport.write_eof()
    assert (raw.writes, raw.calls) == ([b"a"], ["write_eof"])
    transport.write(b"b")
    transport.close()
    assert (raw.writes, raw.calls) == ([b"a", b"b"], ["write_eof", "close"])
    assert transport.is_closing()
    transport.write(b"late")  # the transport is closing: dropped, as asyncio's does
    await next_turn()
    assert raw.writes == [b"a", b"b"]

    aborted = Recording()
    transport = CoalescingTransport(aborted, loop)
    transport.write(b"c")
    transport.abort()
    await next_turn()
    assert (aborted.writes, aborted.calls) == ([], ["abort"])


@pytest.mark.asyncio
async def test_over_tls_one_record_per_turn(tmp_path: Path) -> None:
    """A real TLS server: twelve events written in one turn arrive intact, and the server's
    TLS layer was asked to encrypt once (its SSL object's write count)."""
    pki, _ = ensure_local_pki(tmp_path)
    events = [b'data: {"n": %d}\n\n' % i for i in range(12)]
    encrypted: list[int] = []

    class Server(asyncio.Protocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            assert isinstance(transport, asyncio.Transport)
            ssl_object = transport.get_extra_info("ssl_object")
            assert isinstance(ssl_object, ssl.SSLObject)
            original = ssl_object.write

            def counted(data: Any) -> int:
                encrypted.append(len(data))
                return original(data)

            ssl_object.write = counted  # type: ignore[method-assign]
            wrapped = CoalescingTransport(transport, asyncio.get_running_loop())
            for event in events:
                wrapped.write(event)
            wrapped.close()

    loop = asyncio.get_running_loop()
    server = await loop.create_server(Server, "127.0.0.1", 0, ssl=ServerTLS(
        cert=pki.cert, key=pki.key).context())  # fmt: skip
    port = server.sockets[0].getsockname()[1]
    try:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", port, ssl=ClientTLS(ca=pki.ca).context(), server_hostname="localhost"
        )
        received = await asyncio.wait_for(reader.read(), timeout=10)
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert received == b"".join(events)
    assert encrypted == [len(received)]
