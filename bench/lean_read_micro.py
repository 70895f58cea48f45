"""CPU per body read of the lean upstream client (issue #27): :class:`LeanResponse.readany`
waiting on a :class:`LeanConnection` whose chunks arrive one per loop turn (``on_body`` from a
``call_soon``, as ``data_received`` delivers them), with the connection's one lazily re-armed
read timer (the client's) against a timer armed and cancelled per wait (the client before it,
kept here as ``_TimerPerWait``), and against the same read path looking the running loop up
per wait and per read (the client before it held its loop, ``_LoopPerWait``: Python 3.11's
``asyncio.get_running_loop()`` makes a ``getpid`` syscall each time), and against a wait that is
a coroutine around the future (the client before its ``wait`` returned the future itself,
``_CoroutineWait``). No socket: the difference
is the read path's own work. Each variant runs against the client in ABBA order within every
round; thread CPU per read, best and median of the rounds.

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


class _LoopPerWait(LeanConnection):
    """The wait before the connection held its loop: ``get_running_loop()`` per wait."""

    async def wait(self, when: float | None, *, idle: bool) -> None:
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        self._due = when
        if when is not None:
            self._due_error = ReadIdleError if idle else TimeoutError
            if self._timer is None or self._timer_at > when:
                self._arm(loop, when)
        try:
            await waiter
        finally:
            self._waiter = None


class _CoroutineWait(LeanConnection):
    """The wait before it returned its future: a coroutine around it (and a ``finally``)."""

    async def wait(self, when: float | None, *, idle: bool) -> None:
        loop = self.loop
        waiter = self._waiter = loop.create_future()
        self._due = when
        if when is not None:
            self._due_error = ReadIdleError if idle else TimeoutError
            if self._timer is None or self._timer_at > when:
                self._arm(loop, when)
        try:
            await waiter
        finally:
            self._waiter = None


class _LoopPerRead(LeanResponse):
    """``readany`` before the connection held its loop: ``get_running_loop()`` per read."""

    async def readany(self) -> bytes:
        conn = self._conn
        assert conn is not None
        while True:
            if conn.has_data():
                return conn.take()
            if conn.complete:
                return b""
            loop_now = asyncio.get_running_loop().time()
            idle_at = None if self._idle is None else loop_now + self._idle
            if idle_at is not None and idle_at < self._deadline:
                await conn.wait(idle_at, idle=True)
            else:
                await conn.wait(self._deadline, idle=False)


def _expire(waiter: asyncio.Future[None], error: type[TimeoutError]) -> None:
    if not waiter.done():
        waiter.set_exception(error())


Kind = tuple[type[LeanConnection], type[LeanResponse]]
KINDS: dict[str, Kind] = {
    "client": (LeanConnection, LeanResponse),
    "timer per wait": (_TimerPerWait, LeanResponse),
    "loop per read": (_LoopPerWait, _LoopPerRead),
    "coroutine wait": (_CoroutineWait, LeanResponse),
}


async def _reads(kind: Kind, reads: int) -> float:
    """Thread-CPU microseconds per read of ``reads`` chunks, each arriving after the wait."""
    loop = asyncio.get_running_loop()
    conn = kind[0](_Pool(), loop)  # type: ignore[arg-type]
    conn.active, conn.headers_done = True, True
    resp = kind[1](conn, deadline=loop.time() + 3600.0, idle=60.0)
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
    results: dict[str, list[float]] = {name: [] for name in KINDS}
    await _reads(KINDS["client"], reads // 10)  # warm up
    for _ in range(rounds):
        for other in ("timer per wait", "loop per read", "coroutine wait"):
            for name in ("client", other, other, "client"):
                results[name].append(await _reads(KINDS[name], reads))
    base = statistics.median(results["client"])
    for name, values in results.items():
        median = statistics.median(values)
        print(f"{name}: CPU us per read: best {min(values):.2f}, median {median:.2f} "
              f"({median / base:.2f}x the client)")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.lean_read_micro", description=__doc__)
    parser.add_argument("--reads", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    uvloop.run(_main(args.reads, args.rounds))  # the router's loop


if __name__ == "__main__":
    main()
