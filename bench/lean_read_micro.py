"""CPU per body read of the lean upstream client (issue #27): :class:`LeanResponse.readany`
waiting on a :class:`LeanConnection` whose chunks arrive one per loop turn (``on_body`` from a
``call_soon``, as ``data_received`` delivers them), with the connection's one lazily re-armed
read timer (the client's) against a timer armed and cancelled per wait (the client before it,
kept here as ``_TimerPerWait``). No socket: the difference is the read path's own work. The two
alternate in ABBA order within every round; thread CPU per read, best and median of the rounds.

``python -m bench.lean_read_micro [--reads 20000] [--rounds 5]``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import uvloop

from runtime.upstream.lean_conn import LeanConnection, LeanResponse
from runtime.upstream.response import ReadIdleError


class _Pool:
    def forget(self, conn: object) -> None:
        pass


class _TimerPerWait(LeanConnection):
    """The wait before the lazily re-armed timer: a ``call_at`` and a ``cancel`` each."""

    async def wait(self, when: float | None, *, idle: bool) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = None
        if when is not None:
            timer = loop.call_at(when, _expire, waiter, ReadIdleError if idle else TimeoutError)
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()


def _expire(waiter: asyncio.Future[None], error: type[TimeoutError]) -> None:
    if not waiter.done():
        waiter.set_exception(error())


async def _reads(kind: type[LeanConnection], reads: int) -> float:
    """Thread-CPU microseconds per read of ``reads`` chunks, each arriving after the wait."""
    loop = asyncio.get_running_loop()
    conn = kind(_Pool())  # type: ignore[arg-type]
    conn.active, conn.headers_done = True, True
    resp = LeanResponse(conn, deadline=loop.time() + 3600.0, idle=60.0)
    chunk = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
    on_body: Any = conn.on_body
    started = time.thread_time()
    for _ in range(reads):
        loop.call_soon(on_body, chunk)
        await resp.readany()
    spent = time.thread_time() - started
    conn._disarm()
    return spent / reads * 1e6


async def _main(reads: int, rounds: int) -> None:
    results: dict[str, list[float]] = {"lazy timer": [], "timer per wait": []}
    kinds = {"lazy timer": LeanConnection, "timer per wait": _TimerPerWait}
    await _reads(LeanConnection, reads // 10)  # warm up
    for _ in range(rounds):
        for name in ("lazy timer", "timer per wait", "timer per wait", "lazy timer"):
            results[name].append(await _reads(kinds[name], reads))
    base = statistics.median(results["timer per wait"])
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name}: CPU us per read: best {min(values):.2f}, median {median:.2f} "
              f"({median / base:.2f}x)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lean_read_micro", description=__doc__)
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    uvloop.run(_main(args.reads, args.rounds))  # the router's loop


if __name__ == "__main__":
    main()
