"""The queued stream's heartbeats and failure ending, on a recording sink (issue #33)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable

import pytest
from fixtures.wait import async_eventually

from bench.stream_micro import measure
from runtime.gateway.errors import ApiError
from runtime.gateway.heartbeat import MAX_INTERVAL_S, QueuedStream, comment

pytestmark = pytest.mark.unit

HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8")]


class Recorder:
    def __init__(self) -> None:
        self.starts: list[tuple[int, list[tuple[bytes, bytes]]]] = []
        self.chunks: list[tuple[bytes, bool]] = []

    async def start_response(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.starts.append((status, list(headers)))

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        self.chunks.append((data, last))


def stream(sink: Recorder, interval_s: float = 0.01) -> QueuedStream:
    return QueuedStream(sink, interval_s=interval_s, headers=HEADERS, kind="chat", model="m")


async def headers_out(sink: Recorder) -> None:
    """Wait (bounded) until the heartbeats started the response."""
    await async_eventually(lambda: sink.starts, timeout=2, interval=0.005, what="the headers")


def test_comments_are_sse_comment_events() -> None:
    assert comment(3) == b": queued position=3\n\n"
    assert comment(None) == b": queued\n\n"


@pytest.mark.asyncio
async def test_a_request_that_never_waits_sends_nothing_early() -> None:
    sink = Recorder()
    s = stream(sink)
    await s.stop()
    await s.start_response(200, [(b"x", b"1")])  # the relay's own start goes through
    assert sink.starts == [(200, [(b"x", b"1")])]
    assert sink.chunks == []


@pytest.mark.asyncio
async def test_a_queued_request_beats_until_stopped_and_the_relay_does_not_start_twice() -> None:
    sink = Recorder()
    s = stream(sink)
    positions = iter([2, 1, None, None, None, None, None, None])
    s.queued(lambda: next(positions))
    await async_eventually(lambda: s.beats >= 3, timeout=2, interval=0.005, what="3 beats")
    await s.stop()
    beats = s.beats
    assert beats >= 3
    assert sink.starts == [(200, HEADERS)]
    assert [c for c, _ in sink.chunks[:2]] == [
        b": queued position=2\n\n",
        b": queued position=1\n\n",
    ]
    await asyncio.sleep(0.03)  # three intervals: an absence cannot be polled for
    assert s.beats == beats  # stopped for good
    await s.start_response(200, [(b"x", b"1")])
    assert len(sink.starts) == 1


@pytest.mark.asyncio
async def test_a_failure_after_the_headers_ends_the_stream_with_an_error_event() -> None:
    sink = Recorder()
    s = stream(sink)
    s.queued(lambda: 1)
    await headers_out(sink)
    await s.fail(ApiError.of("deadline_exceeded", when="while it was queued"), None)
    data, last = sink.chunks[-1]
    assert last
    frames = data.decode().split("\n\n")
    terminal = json.loads(frames[0].removeprefix("data: "))
    assert terminal["choices"][0]["finish_reason"] == "error"
    assert terminal["error"]["code"] == "deadline_exceeded"
    assert frames[1] == "data: [DONE]"


@pytest.mark.asyncio
async def test_a_client_gone_gets_nothing_and_a_cut_gets_its_reason() -> None:
    gone, cut = Recorder(), Recorder()
    for sink in (gone, cut):
        s = stream(sink)
        s.queued(lambda: 1)
        await headers_out(sink)
        await s.fail(asyncio.CancelledError(), None if sink is gone else "router_shutdown")
    assert all(not last for _, last in gone.chunks)
    assert b'"code":"router_shutdown"' in cut.chunks[-1][0]


@pytest.mark.asyncio
async def test_a_failure_before_any_heartbeat_is_left_to_the_http_error() -> None:
    sink = Recorder()
    await stream(sink).fail(ApiError.of("queue_full", model="m", reason="full"), None)
    assert sink.starts == sink.chunks == []


def test_the_interval_is_at_most_five_seconds() -> None:
    assert stream(Recorder(), interval_s=60.0)._interval == MAX_INTERVAL_S


def test_the_micro_bench_measures_every_part() -> None:
    numbers = measure(iterations=50, tokens=20)
    assert set(numbers) == {"ratelimit_us", "heartbeat_setup_us", "heartbeat_queued_us",
                            "heartbeat_beat_us", "sli_judge_us"}  # fmt: skip
    assert all(value > 0 for value in numbers.values())


class Stuck(Recorder):
    """A client that stopped reading: a body chunk never finishes sending."""

    writing = False

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        self.writing = True
        await asyncio.Event().wait()


@pytest.mark.asyncio
async def test_a_beat_stuck_on_a_client_that_does_not_read_does_not_hold_the_request() -> None:
    sink = Stuck()
    s = stream(sink)
    s.queued(lambda: 1)
    # the first beat is being written, and never will be
    await async_eventually(lambda: sink.writing, timeout=2, interval=0.005, what="a beat")
    async with asyncio.timeout(5):
        await s.stop()
    assert s.beats == 0
