"""The relay's CPU per streamed chunk (issue #27): an engine's SSE chunks through
:class:`~runtime.upstream.response.UpstreamResponse` (its decoder), the migrate stage's
:class:`~runtime.gateway.migrate.MigratingStream` (on by default) and
:func:`~runtime.gateway.relay.relay_stream` into a sink that drops them. The aiohttp
response is a stand-in that hands out chunks from memory (one SSE event per read, as vLLM
writes them), so what is timed is the router's own code per chunk, not the socket's.
Used by ``bench.stream_micro``."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable
from typing import Any

from prometheus_client import CollectorRegistry

from runtime.gateway.migrate import MigratingStream
from runtime.gateway.relay import relay_stream
from runtime.telemetry.metrics import RouterMetrics, StageLabels
from runtime.telemetry.resume_metrics import ResumeMetrics
from runtime.upstream.response import UpstreamResponse
from runtime.upstream.sse import SSEDecoder

BODY = b'{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}'


def payload(i: int, *, finish: str | None = None) -> bytes:
    """A vLLM chat chunk (its JSON spacing)."""
    end = b"null" if finish is None else b'"' + finish.encode() + b'"'
    return (
        b'{"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1764000000,'
        b'"model":"m","choices":[{"index":0,"delta":{"content":" tok' + str(i).encode() + b'"},'
        b'"logprobs":null,"finish_reason":' + end + b"}]}"
    )


USAGE = (
    b'{"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1764000000,'
    b'"model":"m","choices":[],"usage":{"prompt_tokens":12,"total_tokens":212,'
    b'"completion_tokens":200}}'
)


def engine_chunks(tokens: int) -> list[bytes]:
    """One read per event: a role chunk, ``tokens`` content chunks (the last one final),
    the usage chunk and ``[DONE]``."""
    events = [payload(0)] + [payload(i, finish="stop" if i == tokens else None)
                             for i in range(1, tokens + 1)]  # fmt: skip
    return [b"data: " + e + b"\n\n" for e in [*events, USAGE]] + [b"data: [DONE]\n\n"]


class _Content:
    __slots__ = ("_chunks",)

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)

    async def readany(self) -> bytes:
        return next(self._chunks, b"")


class _Response:
    """What :class:`UpstreamResponse` uses of an aiohttp response."""

    status = 200
    headers: dict[str, str] = {}
    closed = False

    def __init__(self, chunks: list[bytes]) -> None:
        self.content = _Content(chunks)

    def release(self) -> None:
        return None

    def close(self) -> None:
        return None


class _Sink:
    async def start_response(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        return None

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        return None


async def _never(body: bytes, broken: frozenset[int]) -> UpstreamResponse:
    raise AssertionError("a healthy stream never opens a continuation")


def relay_us_per_chunk(
    tokens: int, iterations: int, *, include_usage: bool, migrate: bool
) -> float:
    """CPU microseconds per engine chunk relayed (the stream's setup spread over them)."""
    chunks = engine_chunks(tokens)
    metrics = RouterMetrics()
    labels = StageLabels(model="m", version="v1", endpoint="1")
    resume = ResumeMetrics(CollectorRegistry())
    sink = _Sink()

    async def one() -> None:
        decoder = SSEDecoder()
        first = decoder.feed(chunks[0])
        response: Any = _Response(chunks[1:])
        upstream = UpstreamResponse(response, endpoint_id=1, decoder=decoder, first_events=first)
        source: Any = upstream
        if migrate:
            source = MigratingStream(upstream, kind="chat", body=BODY, open_next=_never,
                                     limit=2, metrics=resume)  # fmt: skip
        await relay_stream(sink, source, kind="chat", include_usage=include_usage,
                           headers=(), metrics=metrics, labels=labels,
                           on_tokens=lambda _n: None)  # fmt: skip

    async def run() -> float:
        await one()
        start = time.process_time()
        for _ in range(iterations):
            await one()
        return (time.process_time() - start) / iterations / len(chunks) * 1e6

    return asyncio.run(run())
