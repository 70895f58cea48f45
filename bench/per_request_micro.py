"""Micro-benchmark of three per-request cuts of issue #27, old shape against new, one process.

``python -m bench.per_request_micro [--iterations 20000] [--rounds 5]`` (run it pinned:
``taskset -c 0``) times, in CPU microseconds per request (``time.process_time``), rounds
alternating A B B A:

- ``slis``: one finished streamed request counted toward the SLIs
  (:meth:`SliCounters.observe`: five events and four good events) with prometheus_client
  counters (``multiprocess=True``, the shape before) against the plain numbers;
- ``exits``: a request context's releases as the stages register them on the common path
  (two ``hold``, two ``hold_async``, one ``on_failure``), then the exit stack run, through
  contextlib's ``callback`` / ``push_async_callback`` / a closure (before) against the
  objects pushed as themselves (:mod:`runtime.gateway.pipeline.context`);

and counts, for ``exits``, the objects the collector tracks that one request holds until
its end (``gc.get_objects()`` before and after registering, with nothing else allocated).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import time
from collections.abc import Callable, Mapping, Sequence

from prometheus_client import CollectorRegistry

from bench.account_micro import record as account_record
from runtime.gateway.pipeline.context import Release, _AsyncRelease, _OnFailure, _push
from runtime.telemetry.slis import SliCounters
from runtime.testing.snapshots import SnapshotBuilder


def slis_variants() -> dict[str, Callable[[], None]]:
    record = account_record()
    snapshot = SnapshotBuilder().add_class("standard", band=0, itl_slo_ms=50).snapshot()
    counters = SliCounters(CollectorRegistry(), multiprocess=True)
    plain = SliCounters(CollectorRegistry(), multiprocess=False)
    return {
        "slis: prometheus counters": lambda: counters.observe(record, snapshot),
        "slis: plain numbers": lambda: plain.observe(record, snapshot),
    }


def _nothing() -> None:
    pass


async def _nothing_async() -> None:
    pass


async def _on_error(error: BaseException) -> None:
    pass


def _old_register(stack: contextlib.AsyncExitStack) -> None:
    for name in ("settle", "grant"):
        stack.callback(Release(name, _nothing))
    stack.push_async_callback(_nothing_async)
    stack.push_async_callback(_nothing_async)

    async def exit_(_type: object, error: BaseException | None, _tb: object) -> bool:
        if error is not None:
            await _on_error(error)
        return False

    stack.push_async_exit(exit_)


def _new_register(stack: contextlib.AsyncExitStack) -> None:
    for name in ("settle", "grant"):
        _push(stack, Release(name, _nothing), is_sync=True)
    _push(stack, _AsyncRelease(_nothing_async), is_sync=False)
    _push(stack, _AsyncRelease(_nothing_async), is_sync=False)
    _push(stack, _OnFailure(_on_error), is_sync=False)


def _run(register: Callable[[contextlib.AsyncExitStack], None]) -> None:
    stack = contextlib.AsyncExitStack()
    register(stack)
    coro = stack.__aexit__(None, None, None)
    with contextlib.suppress(StopIteration):
        coro.send(None)  # nothing in it suspends: one step runs it to its end


def exits_variants() -> dict[str, Callable[[], None]]:
    return {
        "exits: contextlib wrappers": lambda: _run(_old_register),
        "exits: pushed as themselves": lambda: _run(_new_register),
    }


def tracked(register: Callable[[contextlib.AsyncExitStack], None]) -> int:
    """Objects the collector tracks that registering adds (the stack's own included)."""
    gc.collect()
    before = len(gc.get_objects())
    stack = contextlib.AsyncExitStack()
    register(stack)
    after = len(gc.get_objects())
    _ = stack
    return after - before


def per_call(iterations: int, call: Callable[[], object]) -> float:
    start = time.process_time()
    for _ in range(iterations):
        call()
    return (time.process_time() - start) / iterations * 1e6


def ab(iterations: int, rounds: int, variants: Mapping[str, Callable[[], object]]) -> None:
    found: dict[str, list[float]] = {name: [] for name in variants}
    order = list(variants)
    for _ in range(rounds):
        for name in order:
            found[name].append(per_call(iterations, variants[name]))
        order.reverse()
    for name, values in found.items():
        shown = " / ".join(f"{value:.2f}" for value in values)
        print(f"{name}: {shown} us per request (median {statistics.median(values):.2f})")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.per_request_micro")
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    ab(args.iterations, args.rounds, slis_variants())
    ab(args.iterations, args.rounds, exits_variants())
    print(f"exits: tracked objects held per request: contextlib wrappers "
          f"{tracked(_old_register)}, pushed as themselves {tracked(_new_register)}")  # fmt: skip


if __name__ == "__main__":
    main()
