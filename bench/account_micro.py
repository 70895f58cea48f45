"""Micro-benchmark of the account stage's per-version stats and SLI counters, per request.

``python -m bench.account_micro [--iterations 50000]`` records one finished, streamed request
(8 tokens: 7 inter-token gaps, TTFT, queue and e2e timings, a class with TTFT, ITL and e2e
objectives) with ``time.process_time``, best of three passes:

- ``version_stats``: :meth:`VersionStats.record_request` (rollout gates' counts, no I/O);
- ``slis``: :meth:`SliCounters.observe` (the five SLI counters' events and good events);
- ``flush``: :meth:`VersionStats.flush`'s own work per request, over a pipeline that only
  collects the commands (one flush per ``--per-flush`` requests; no Redis).

To compare with an older commit, copy this file into a ``git archive`` of it and run it there
with ``PYTHONPATH`` at that copy.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any, cast

from prometheus_client import CollectorRegistry

from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.slis import SliCounters
from runtime.telemetry.versions import VersionStats
from runtime.testing.snapshots import SnapshotBuilder


def record() -> RequestRecord:
    return RequestRecord(
        request_id="r", route="/v1/chat/completions", tenant="t", model="m", version="v1",
        klass="standard", stream=True, status=200, outcome="ok", prompt_tokens=12,
        completion_tokens=8, itl_ms=[4.1, 3.9, 4.4, 4.0, 5.2, 3.8, 4.3],
        timings_ms={"auth": 0.2, "queue": 0.1, "upstream_ttft": 12.5, "e2e": 41.0},
    )  # fmt: skip


def best(repeats: int, iterations: int, call: Callable[[], object]) -> float:
    """Best CPU microseconds per call over ``repeats`` passes."""
    found = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        for _ in range(iterations):
            call()
        found = min(found, time.process_time() - start)
    return found / iterations * 1e6


class _Pipe:
    """A pipeline that keeps nothing (the flush's own work without Redis)."""

    def hincrby(self, key: str, name: str, value: int) -> None:
        pass

    def expire(self, key: str, seconds: int) -> None:
        pass

    async def execute(self) -> list[Any]:
        return []

    async def __aenter__(self) -> _Pipe:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        value: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass


class _Client:
    def pipeline(self, *, transaction: bool) -> _Pipe:
        return _Pipe()


def measure(iterations: int, per_flush: int) -> dict[str, float]:
    finished = record()
    stats = VersionStats("redis://unused", namespace="bench", clock=lambda: 1_000.0)
    snapshot = SnapshotBuilder().add_class("standard", band=0, itl_slo_ms=50).snapshot()
    slis = SliCounters(CollectorRegistry())
    result = {
        "version_stats_us": best(3, iterations, lambda: stats.record_request(finished)),
        "slis_us": best(3, iterations, lambda: slis.observe(finished, snapshot)),
    }
    stats._client = cast(Any, _Client())  # a benchmark's stand-in for Redis

    def flushed() -> None:
        for _ in range(per_flush):
            stats.record_request(finished)
        asyncio.run(stats.flush())

    rounds = max(1, iterations // per_flush)
    result["record_and_flush_us"] = best(3, rounds, flushed) / per_flush
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.account_micro")
    parser.add_argument("--iterations", type=int, default=50_000)
    parser.add_argument("--per-flush", type=int, default=100)
    args = parser.parse_args(argv)
    for name, value in measure(args.iterations, args.per_flush).items():
        print(f"{name}: {value:.2f} us CPU per request (best of 3)")


if __name__ == "__main__":
    main()
