"""CPU cost of issue #33's request-path additions: rate-limit headers, queued heartbeats, SLIs.

``python -m bench.stream_micro [--iterations 20000] [--tokens 200]`` measures with
``time.process_time`` (CPU, not wall) over many iterations:

- ``ratelimit_us``: per admitted request, the :class:`RateState` from the admission's answer
  and its six ``x-ratelimit-*`` headers (what the admit stage adds; the numbers come with
  the admission call itself, so there is no extra Redis round trip to measure);
- ``heartbeat_setup_us``: per streaming request that goes through the queue stage with
  heartbeats on, the :class:`QueuedStream` wrapper and its stop when the request did not
  wait (the common case: nothing is sent);
- ``heartbeat_queued_us``: per streaming request that does wait: its beat task started,
  the headers and the first comment sent, the task stopped;
- ``heartbeat_beat_us``: per ``: queued`` comment of a waiting stream (the position lookup,
  the comment bytes and one send to a sink that drops it);
- ``sli_judge_us``: per finished stream of ``tokens`` events, the SLI verdicts including the
  new ITL one (the p95 of its gaps).

With ``--relay-rounds N`` (issue #27) it also times the relay per streamed chunk
(:mod:`bench.relay_chunks`: the upstream response's decoder, the migrating stream, the relay,
a sink that drops the bytes), for a client that asked for usage and one that did not, with and
without the migrate stage's wrapper: each round's figure, their median and spread.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence

from bench.relay_chunks import relay_us_per_chunk
from bench.safety_micro import cpu_us
from runtime.admission.limits import Quota, RateState
from runtime.gateway.heartbeat import QueuedStream
from runtime.gateway.ratelimit_headers import ratelimit_headers
from runtime.gateway.relay import SSE_HEADERS
from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.slis import judge


class NullSink:
    """A response sink that drops what it is given."""

    async def start_response(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        return None

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        return None


def async_cpu_us(make: Callable[[], Awaitable[None]], iterations: int) -> float:
    """CPU microseconds per awaited coroutine from ``make`` (one event loop for all)."""

    async def run() -> float:
        await make()
        start = time.process_time()
        for _ in range(iterations):
            await make()
        return (time.process_time() - start) / iterations * 1e6

    return asyncio.run(run())


def measure(iterations: int, tokens: int) -> dict[str, float]:
    quota = Quota(rpm=600, tpm=200_000, concurrency=16)
    sink = NullSink()
    headers = [*SSE_HEADERS, (b"x-switchyard-version", b"v1")]

    def ratelimit() -> object:
        state = RateState.of(quota, used=17, tokens=151_234.0, requests_reset_s=60.0)
        return ratelimit_headers(state)

    async def unqueued() -> None:
        stream = QueuedStream(sink, interval_s=5.0, headers=headers, kind="chat", model="m")
        await stream.stop()

    async def queued() -> None:  # queued: its beat task starts, sends once, is stopped
        stream = QueuedStream(sink, interval_s=5.0, headers=headers, kind="chat", model="m")
        stream.queued(lambda: 1)
        await asyncio.sleep(0)
        await stream.stop()

    beater = QueuedStream(sink, interval_s=5.0, headers=headers, kind="chat", model="m")
    beater.started = True

    async def beat() -> None:  # the body of one iteration of QueuedStream._beat
        await beater.send_chunk(b": queued position=%d\n\n" % 3)

    rng = random.Random(7)
    record = RequestRecord(
        request_id="r", route="/v1/chat/completions", status=200, outcome="ok", stream=True,
        timings_ms={"queue": 3.0, "upstream_ttft": 40.0, "e2e": 4000.0},
        itl_ms=[rng.uniform(15.0, 25.0) for _ in range(tokens)],
    )  # fmt: skip
    return {
        "ratelimit_us": cpu_us(ratelimit, iterations),
        "heartbeat_setup_us": async_cpu_us(unqueued, iterations),
        "heartbeat_queued_us": async_cpu_us(queued, iterations),
        "heartbeat_beat_us": async_cpu_us(beat, iterations),
        "sli_judge_us": cpu_us(
            lambda: judge(record, ttft_slo_ms=500, e2e_slo_ms=30_000, itl_slo_ms=100),
            max(1, iterations // 10),
        ),
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--tokens", type=int, default=200, help="events of a finished stream")
    parser.add_argument("--relay-rounds", type=int, default=0, help="rounds of the relay timing")
    parser.add_argument("--relay-only", action="store_true", help="only the relay timing")
    args = parser.parse_args(argv)
    if args.relay_rounds:
        relay_table(args.tokens, max(1, args.iterations // 100), args.relay_rounds)
    if args.relay_only:
        return
    m = measure(args.iterations, args.tokens)
    print(f"rate-limit state + 6 headers:        {m['ratelimit_us']:7.2f} us CPU / request")
    print(f"heartbeat wrapper, request not queued: {m['heartbeat_setup_us']:5.2f} us CPU / request")
    print(
        f"queued: task, headers, first beat, stop: {m['heartbeat_queued_us']:5.2f} us CPU / request"
    )
    print(f"one ': queued' heartbeat:             {m['heartbeat_beat_us']:7.2f} us CPU / beat")
    print(f"SLI verdicts, {args.tokens}-event stream (ITL p95): "
          f"{m['sli_judge_us']:7.2f} us CPU / request")  # fmt: skip


def relay_table(tokens: int, streams: int, rounds: int) -> None:
    """CPU us per relayed chunk, ``rounds`` interleaved rounds of ``streams`` streams each."""
    cases = [(usage, migrate) for usage in (True, False) for migrate in (True, False)]
    figures: dict[tuple[bool, bool], list[float]] = {case: [] for case in cases}
    for _ in range(rounds):
        for usage, migrate in cases:
            figures[usage, migrate].append(
                relay_us_per_chunk(tokens, streams, include_usage=usage, migrate=migrate)
            )
    print(f"relay, CPU us per chunk ({tokens}-token streams, {streams} a round):")
    for (usage, migrate), values in figures.items():
        ordered = sorted(values)
        median = ordered[len(ordered) // 2]
        rounds_text = " / ".join(f"{v:.2f}" for v in values)
        print(f"  include_usage={usage!s:5} migrate={migrate!s:5} median {median:5.2f} "
              f"(min {ordered[0]:.2f}, max {ordered[-1]:.2f}; rounds {rounds_text})")  # fmt: skip


if __name__ == "__main__":
    main()
