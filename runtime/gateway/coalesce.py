"""Fewer, larger writes to the router's clients: what one event-loop turn writes goes out as
one write (issue #30, TLS's CPU per request).

Under TLS every ``transport.write`` becomes at least one TLS record: an encryption, a MAC, a
header and a pass through asyncio's SSL layer (Python code) each. A streamed answer is written
an event at a time, and the router often has several events in hand at once (one upstream read
carries the events the engine wrote meanwhile; the response head comes with the first event;
the last event with ``[DONE]`` and the chunked terminator), each a separate write and record.
:class:`CoalescingTransport` keeps the writes made during one turn of the event loop and sends
them together in a callback scheduled for the same loop's next turn (``call_soon``): nothing
waits on a timer, so no latency is added beyond the turn, and the bytes and their order are
unchanged. ``close`` / ``write_eof`` send what is kept first; ``abort`` drops it (as the
transport's own buffer is dropped). Every other method is the wrapped transport's.

The router's HTTP protocol (:mod:`runtime.gateway.http_protocol`) wraps the transport of each
HTTPS connection; plain HTTP is left as uvicorn writes it (there a write is a ``send`` call,
not a record, and a turn usually holds one write: the wrapper would cost its callback without
a saving to pay for it).
"""

from __future__ import annotations

import asyncio
from typing import Any


class CoalescingTransport(asyncio.Transport):
    """A transport whose writes within one event-loop turn become one write (see above)."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__()
        self._transport = transport
        self._loop = loop
        self._pending: list[bytes] = []
        self._size = 0
        self._scheduled = False

    @property
    def wrapped(self) -> asyncio.Transport:
        return self._transport

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        self._pending.append(bytes(data))
        self._size += len(data)
        if not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self.flush)

    def writelines(self, lines: Any) -> None:
        for data in lines:
            self.write(data)

    def flush(self) -> None:
        """Send what this turn wrote (as one write), unless the transport is closing."""
        self._scheduled = False
        if not self._pending:
            return
        pending, self._pending, self._size = self._pending, [], 0
        if self._transport.is_closing():
            return
        self._transport.write(pending[0] if len(pending) == 1 else b"".join(pending))

    def get_write_buffer_size(self) -> int:
        return self._size + self._transport.get_write_buffer_size()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def abort(self) -> None:
        self._pending, self._size = [], 0
        self._transport.abort()

    # -- the rest is the wrapped transport's -------------------------------------------------

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        self._transport.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._transport.get_protocol()

    def is_reading(self) -> bool:
        return self._transport.is_reading()

    def pause_reading(self) -> None:
        self._transport.pause_reading()

    def resume_reading(self) -> None:
        self._transport.resume_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self._transport.set_write_buffer_limits(high, low)

    def get_write_buffer_limits(self) -> tuple[int, int]:
        return self._transport.get_write_buffer_limits()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()
