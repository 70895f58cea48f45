"""write_head (issue #27): a response head written straight to uvicorn's httptools cycle is
byte for byte what the cycle's own ``send`` writes, leaves the cycle in the same state, and
declines (writing nothing) every head it does not handle, so the server's ``send`` runs."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from uvicorn.protocols.http.flow_control import FlowControl
from uvicorn.protocols.http.httptools_impl import HEADER_RE, HEADER_VALUE_RE, RequestResponseCycle

from runtime.gateway.head_write import BAD_NAME_BYTES, BAD_VALUE_BYTES, cycle_of, write_head

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]

Headers = list[tuple[bytes, bytes]]
STREAM_HEAD = [
    (b"x-request-id", b"0123456789abcdef"),
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
    (b"x-ratelimit-remaining-requests", b"99\t999"),
    (b"x-switchyard-version", b"v1"),
]
STATE = (
    "response_started", "waiting_for_100_continue", "chunked_encoding",
    "expected_content_length", "keep_alive",
)  # fmt: skip


class Transport:
    def __init__(self) -> None:
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.written.append(data)

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed


DATE = [(b"date", b"Fri, 27 Nov 2026 12:00:00 GMT")]


def cycle(
    *, method: str = "POST", keep_alive: bool = True, default: Headers | None = None
) -> tuple[RequestResponseCycle, Transport]:
    transport = Transport()
    made = RequestResponseCycle(
        scope={"method": method},  # type: ignore[typeddict-item]
        transport=transport,  # type: ignore[arg-type]
        flow=FlowControl(transport),  # type: ignore[arg-type]
        logger=logging.getLogger("test"),
        access_logger=logging.getLogger("test.access"),
        access_log=False,
        default_headers=DATE if default is None else default,
        message_event=asyncio.Event(),
        expect_100_continue=True,
        keep_alive=keep_alive,
        on_response=lambda: None,
    )
    return made, transport


def state(made: RequestResponseCycle) -> tuple[Any, ...]:
    return tuple(getattr(made, name) for name in STATE)


@pytest.mark.parametrize(
    ("status", "method", "keep_alive", "default"),
    [
        (200, "POST", True, None),
        (200, "POST", False, None),
        (200, "HEAD", True, None),
        (204, "POST", True, None),
        (201, "POST", True, []),
    ],
)
async def test_the_same_bytes_and_state_as_uvicorn(
    status: int, method: str, keep_alive: bool, default: list[tuple[bytes, bytes]] | None
) -> None:
    ours, ours_written = cycle(method=method, keep_alive=keep_alive, default=default)
    theirs, theirs_written = cycle(method=method, keep_alive=keep_alive, default=default)
    assert write_head(ours, status, list(STREAM_HEAD))
    await theirs.send({"type": "http.response.start", "status": status, "headers": STREAM_HEAD})
    assert ours_written.written == theirs_written.written
    assert state(ours) == state(theirs)
    chunk = b"" if status == 204 else b"data: x\n\n"  # a 204 has no body
    body = {"type": "http.response.body", "body": chunk, "more_body": False}
    await ours.send(body)  # type: ignore[arg-type]
    await theirs.send(body)  # type: ignore[arg-type]
    assert ours_written.written == theirs_written.written


@pytest.mark.parametrize(
    "headers",
    [
        [(b"Content-Type", b"text/event-stream")],  # upper case: uvicorn lowers it
        [(b"content-length", b"2")],
        [(b"transfer-encoding", b"chunked")],
        [(b"connection", b"close")],
        [(b"bad name", b"v")],
        [(b"x-ok", b"bad\nvalue")],
    ],
)
async def test_declines_what_uvicorn_reads_or_refuses(headers: list[tuple[bytes, bytes]]) -> None:
    made, transport = cycle()
    before = state(made)
    assert not write_head(made, 200, [*STREAM_HEAD, *headers])
    assert transport.written == []
    assert state(made) == before


async def test_declines_a_started_paused_or_unknown_head() -> None:
    started, _ = cycle()
    assert write_head(started, 200, list(STREAM_HEAD))
    assert not write_head(started, 200, list(STREAM_HEAD))
    paused, paused_transport = cycle()
    paused.flow.pause_writing()
    assert not write_head(paused, 200, list(STREAM_HEAD))
    unknown, unknown_transport = cycle()
    assert not write_head(unknown, 600, list(STREAM_HEAD))
    assert paused_transport.written == unknown_transport.written == []


async def test_cycle_of_finds_only_an_httptools_send() -> None:
    made, _ = cycle()
    assert cycle_of(made.send) is made
    assert cycle_of(made.receive) is None

    async def send(message: dict[str, Any]) -> None:
        pass

    assert cycle_of(send) is None


async def test_every_byte_refused_as_uvicorn_refuses_it() -> None:
    for byte in range(256):
        one = bytes([byte])
        assert (one in BAD_NAME_BYTES) is (HEADER_RE.search(one) is not None)
        assert (one in BAD_VALUE_BYTES) is (HEADER_VALUE_RE.search(one) is not None)
        made, _ = cycle()
        accepted = write_head(made, 200, [(b"x-" + one + b"x", b"v" + one + b"v")])
        refused = HEADER_RE.search(one) or HEADER_VALUE_RE.search(one) or one.lower() != one
        assert accepted is not bool(refused), byte
