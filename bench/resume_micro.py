"""CPU cost of issue #34's stream migration (the ``migrate`` stage, runtime/gateway/migrate.py).

``python -m bench.resume_micro [--iterations 2000] [--tokens 200]`` measures with
``time.process_time`` (CPU, not wall):

- ``direct_us`` / ``wrapped_us``: per stream of ``tokens`` chat chunks, iterating the upstream
  events directly (what the relay did before) and through :class:`MigratingStream` (what it
  does now on a healthy stream: one generator hop and a list append per chunk); their
  difference over ``tokens`` is the per-chunk cost;
- ``stage_us``: per streaming request, building the stream wrapper (what the stage does);
- ``resume_us``: per break of a ``tokens``-token stream: the relayed payloads decoded, the
  continuation built and encoded (only after a break);
- ``seam_us``: per continuation chunk, its rewrite into the client's stream.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import AsyncGenerator, Sequence

from prometheus_client import CollectorRegistry

from bench.safety_micro import cpu_us
from runtime.gateway.migrate import MigratingStream
from runtime.gateway.resume import (
    Seam,
    continuation,
    decode_document,
    encode_document,
    progress_of,
)
from runtime.telemetry.resume_metrics import ResumeMetrics
from runtime.upstream.response import UpstreamResponse

BODY = json.dumps({
    "model": "m", "stream": True, "max_tokens": 400, "stream_options": {"include_usage": True},
    "messages": [{"role": "user", "content": "Tell me a long story about trains. " * 20}],
}).encode()  # fmt: skip


def chunk(i: int) -> bytes:
    return (
        b'{"id":"chatcmpl-0123456789abcdef","object":"chat.completion.chunk","created":1764000000,'
        b'"model":"m","choices":[{"index":0,"delta":{"content":" tok' + str(i).encode() + b'"},'
        b'"logprobs":null,"finish_reason":null}]}'
    )


class Events:
    """Upstream events from memory (the bench's stand-in for an engine's stream)."""

    endpoint_id = 1

    def __init__(self, payloads: list[bytes]) -> None:
        self.payloads = payloads

    async def events(self) -> AsyncGenerator[bytes, None]:
        for payload in self.payloads:
            yield payload

    async def aclose(self) -> None:
        return None


async def _never(body: bytes, broken: frozenset[int]) -> UpstreamResponse:
    raise AssertionError("a healthy stream never opens a continuation")


def measure(iterations: int, tokens: int) -> dict[str, float]:
    payloads = [chunk(i) for i in range(tokens)]
    metrics = ResumeMetrics(CollectorRegistry())

    def wrapper() -> MigratingStream:
        return MigratingStream(Events(payloads), kind="chat", body=BODY, open_next=_never,  # type: ignore[arg-type]
                               limit=2, metrics=metrics)  # fmt: skip

    async def read_all(direct: bool) -> float:
        start = time.process_time()
        for _ in range(iterations):
            source = Events(payloads) if direct else wrapper()
            async for _payload in source.events():
                pass
        return (time.process_time() - start) / iterations * 1e6

    direct = asyncio.run(read_all(True))
    wrapped = asyncio.run(read_all(False))

    def resume() -> bytes:
        progress = progress_of("chat", payloads)
        body = continuation("chat", decode_document(BODY), progress)
        assert body is not None
        return encode_document(body)

    seam = Seam("chat", progress_of("chat", payloads))
    return {
        "direct_us": direct,
        "wrapped_us": wrapped,
        "per_chunk_us": (wrapped - direct) / tokens,
        "stage_us": cpu_us(wrapper, iterations * 10),
        "resume_us": cpu_us(resume, iterations),
        "seam_us": cpu_us(lambda: seam.rewrite(payloads[7]), iterations * 10),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--tokens", type=int, default=200, help="chunks of a stream")
    args = parser.parse_args(argv)
    m = measure(args.iterations, args.tokens)
    print(f"{args.tokens}-chunk stream, direct:           {m['direct_us']:9.1f} us CPU")
    print(f"{args.tokens}-chunk stream, through migrate:  {m['wrapped_us']:9.1f} us CPU")
    print(f"per chunk, the migrate wrapper:        {m['per_chunk_us']:9.3f} us CPU")
    print(f"per request, the stage's wrapper:      {m['stage_us']:9.3f} us CPU")
    print(f"per break, decode + continuation:      {m['resume_us']:9.1f} us CPU")
    print(f"per continuation chunk, the seam:      {m['seam_us']:9.3f} us CPU")


if __name__ == "__main__":
    main()
