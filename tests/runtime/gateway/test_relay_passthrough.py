"""The relay forwards the engine's chunks as they came when nothing in them changes (no
re-framing), reads only what it must, and frames what it changes or cannot forward whole."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterable
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from runtime.gateway.migrate import MigratingStream
from runtime.gateway.relay import DONE_FRAME, RelayResult, relay_stream
from runtime.telemetry.metrics import RouterMetrics, StageLabels
from runtime.telemetry.resume_metrics import ResumeMetrics
from runtime.upstream.response import UpstreamResponse
from runtime.upstream.sse import SSEDecoder

pytestmark = pytest.mark.unit


def event(i: int, *, finish: str | None = None) -> bytes:
    end = "null" if finish is None else f'"{finish}"'
    return (
        '{"id":"c-1","object":"chat.completion.chunk","created":1,"model":"m","choices":'
        f'[{{"index":0,"delta":{{"content":" t{i}"}},"finish_reason":{end}}}]}}'
    ).encode()


USAGE = (b'{"id":"c-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],'
         b'"system_fingerprint":"fp","usage":{"prompt_tokens":3,"completion_tokens":4,'
         b'"total_tokens":7}}')  # fmt: skip


def frame(*payloads: bytes) -> bytes:
    return b"".join(b"data: " + p + b"\n\n" for p in payloads)


class Content:
    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks

    async def readany(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


class Response:
    """The part of an aiohttp response that UpstreamResponse reads: chunks from memory."""

    status = 200
    headers: dict[str, str] = {}
    closed = False

    def __init__(self, chunks: list[bytes]) -> None:
        self.content = Content(chunks)

    def release(self) -> None:
        return None

    def close(self) -> None:
        return None


class Sink:
    def __init__(self) -> None:
        self.sent: list[bytes] = []

    async def start_response(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        return None

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        self.sent.append(data)


async def _never(body: bytes, broken: frozenset[int]) -> UpstreamResponse:
    raise AssertionError("never opened")


def relay(
    chunks: list[bytes], *, include_usage: bool, migrating: bool = True,
    metrics: RouterMetrics | None = None,
) -> tuple[Sink, RelayResult]:  # fmt: skip
    """The engine's ``chunks`` (the first is read when it opens) through the relay."""
    decoder = SSEDecoder()
    first = decoder.feed(chunks[0])
    response: Any = Response(chunks[1:])
    source: Any = UpstreamResponse(response, endpoint_id=1, decoder=decoder, first_events=first)
    if migrating:  # as the migrate stage wraps it by default
        source = MigratingStream(source, kind="chat", body=b"{}", open_next=_never, limit=2,
                                 metrics=ResumeMetrics(CollectorRegistry()))  # fmt: skip
    sink = Sink()
    result = asyncio.run(relay_stream(
        sink, source, kind="chat", include_usage=include_usage, headers=(),
        metrics=metrics or RouterMetrics(), labels=StageLabels(model="m"),
    ))  # fmt: skip
    return sink, result


@pytest.mark.parametrize("migrating", [True, False])
def test_a_client_that_asked_for_usage_gets_the_engines_own_chunks(migrating: bool) -> None:
    chunks = [frame(event(0)), frame(event(1)), frame(event(2)), frame(event(3, finish="stop")),
              frame(USAGE), DONE_FRAME]  # fmt: skip
    engine = list(chunks)
    sink, result = relay(chunks, include_usage=True, migrating=migrating)
    assert b"".join(sink.sent) == b"".join(engine)
    # forwarded, not re-framed: the very objects read (the opening one was decoded at open)
    assert all(sent is read for sent, read in zip(sink.sent[1:5], engine[1:5], strict=True))
    assert result.usage is not None
    assert result.usage.completion_tokens == 4
    assert result.events == 5


def test_without_usage_asked_only_the_final_and_usage_chunks_are_rewritten() -> None:
    chunks = [frame(event(0)), frame(event(1)), frame(event(2, finish="stop")), frame(USAGE),
              DONE_FRAME]  # fmt: skip
    engine = list(chunks)
    sink, result = relay(chunks, include_usage=False)
    assert sink.sent[1] is engine[1]  # a plain token chunk: as it came
    stamped = json.loads(sink.sent[2].removeprefix(b"data: ").split(b"\n\n")[0])
    assert stamped["choices"][0]["finish_reason"] == "stop"
    assert stamped["system_fingerprint"] == "fp"  # what vLLM puts there for this client
    assert b'"usage"' not in b"".join(sink.sent)  # the usage chunk is the router's, dropped
    assert sink.sent[-1].endswith(DONE_FRAME)
    assert result.usage is not None
    assert result.usage.total_tokens == 7


def test_chunks_that_split_or_merge_events_are_framed_and_still_arrive_whole() -> None:
    merged = frame(event(1), event(2))  # two events in one read: forwarded as they came
    split = frame(event(3))
    chunks = [frame(event(0)), merged, split[:20], split[20:], frame(USAGE), DONE_FRAME]
    sink, result = relay(chunks, include_usage=True)
    assert sink.sent[1] is merged
    assert b"".join(sink.sent) == frame(*[event(i) for i in range(4)], USAGE) + DONE_FRAME
    assert result.events == 5
    assert len(result.gaps_ms) == 4  # a gap per event after the first (0 within one read)


def test_a_break_after_half_an_event_sends_no_half_event() -> None:
    cut = frame(event(2))[:25]
    sink, result = relay([frame(event(0)), frame(event(1)), cut], include_usage=True)
    assert result.outcome == "stream_broken"
    body = b"".join(sink.sent)
    assert body.endswith(DONE_FRAME)
    frames = [json.loads(f.removeprefix(b"data: ")) for f in body[: -len(DONE_FRAME)].split(
        b"\n\n") if f]  # fmt: skip
    assert [f["choices"][0].get("delta", {}).get("content") for f in frames[:-1]] == [" t0", " t1"]
    assert frames[-1]["choices"][0]["finish_reason"] == "error"


def test_inter_token_gaps_reach_the_histogram_in_batches_and_at_the_end() -> None:
    metrics = RouterMetrics()
    chunks = [frame(event(i)) for i in range(12)] + [frame(USAGE), DONE_FRAME]
    _, result = relay(chunks, include_usage=True, metrics=metrics)
    observer = metrics.stage_observer("inter_token", StageLabels(model="m"))
    [metric] = observer.collect()
    count = next(s.value for s in metric.samples if s.name.endswith("_count"))
    total = next(s.value for s in metric.samples if s.name.endswith("_sum"))
    assert count == len(result.gaps_ms) == 12
    assert total == pytest.approx(sum(result.gaps_ms) / 1000.0)
