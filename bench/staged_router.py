"""``python -m bench.staged_router OUT_JSON [router args]``: ``python -m runtime.gateway`` with
each request's time before its first byte taken apart by stage (issue #27), for
:mod:`bench.ttft_stages`. Nothing of this is in the product: the wrappers are installed here,
around the router's own classes, before it starts.

Per inference request it records, in wall and thread-CPU microseconds:

- ``head->task``: uvicorn parsed the request head (``on_headers_complete``) until the request's
  task runs the consumer (the loop's scheduling);
- ``task->respond``: the consumer reads the body and builds the context;
- one row per stage of the inference pipeline, in order (``dispatch`` is the upstream's open:
  connection, request written, its response head read, retries);
- ``relay->first byte``: the relay stage until the first body chunk goes to uvicorn
  (``relay`` then holds only what comes after the first byte);
- ``(relay) end releases``: the early releases before the last chunk (settling, the grant,
  the freed slot's write), inside the ``relay`` row;
- ``releases`` and ``account``: the exit stack and the accounting, after the last byte.

and per stage the Redis commands written (``send_packed_command``) and the tasks created, each
attributed to the stage running when it happened (the background tasks' as ``background``).
SIGUSR1 starts a window (clearing what came before), SIGUSR2 writes the window's samples as
JSON to ``OUT_JSON`` (whole, then renamed into place). The wrappers cost a few microseconds per
stage themselves, alike for every checkout they run.
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import os
import runpy
import signal
import sys
import time
from collections import defaultdict
from collections.abc import Coroutine
from types import FrameType
from typing import Any

HEAD = "switchyard.bench.head_ns"
BACKGROUND = "background"


class Trace:
    """One request's rows: (name, wall ns, cpu ns), in order."""

    __slots__ = ("first_byte", "mark", "rows")

    def __init__(self, mark: tuple[int, int]) -> None:
        self.rows: list[tuple[str, int, int]] = []
        self.first_byte: tuple[int, int] | None = None  # (wall, cpu) when it went out
        self.mark = mark  # the last checkpoint

    def row(self, name: str) -> None:
        """A row from the last checkpoint to now."""
        now = _now()
        self.rows.append((name, now[0] - self.mark[0], now[1] - self.mark[1]))
        self.mark = now


class Book:
    """What the window recorded."""

    def __init__(self) -> None:
        self.on = False
        self.traces: list[Trace] = []
        self.redis: defaultdict[str, int] = defaultdict(int)
        self.tasks: defaultdict[str, int] = defaultdict(int)
        self.connects: defaultdict[str, int] = defaultdict(int)
        self.gc: defaultdict[str, list[float]] = defaultdict(list)  # generation -> ms each
        self._gc_started = 0
        self.cpu_start = 0.0

    def start(self) -> None:
        self.traces, self.redis, self.tasks = [], defaultdict(int), defaultdict(int)
        self.connects = defaultdict(int)
        self.gc = defaultdict(list)
        self.cpu_start = time.process_time()
        self.on = True

    def dump(self, out: str) -> None:
        self.on = False
        data = {
            "process_cpu_s": time.process_time() - self.cpu_start,
            "traces": [{"rows": t.rows, "first_byte": t.first_byte} for t in self.traces if t.rows],
            "redis_commands": dict(self.redis),
            "tasks_created": dict(self.tasks),
            "upstream_connects": dict(self.connects),
            "gc_ms": dict(self.gc),
        }
        with open(out + ".part", "w") as fh:
            json.dump(data, fh)
        os.replace(out + ".part", out)

    def on_gc(self, phase: str, info: dict[str, int]) -> None:
        """A ``gc.callbacks`` hook: how long each collection took, by generation."""
        if phase == "start":
            self._gc_started = time.perf_counter_ns()
        elif self.on:
            self.gc[str(info["generation"])].append(
                (time.perf_counter_ns() - self._gc_started) / 1e6
            )


BOOK = Book()
TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar("trace", default=None)
STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("stage", default=BACKGROUND)


def _now() -> tuple[int, int]:
    return time.perf_counter_ns(), time.thread_time_ns()


class TimedStage:
    """A stage, its wall and CPU time recorded in the request's trace."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name

    async def __call__(self, ctx: Any) -> None:
        trace = TRACE.get()
        if trace is None:
            await self.inner(ctx)
            return
        token = STAGE.set(self.name)
        trace.mark = start = _now()  # the loop between two stages is nobody's row
        try:
            await self.inner(ctx)
        finally:
            STAGE.reset(token)
            first = trace.first_byte
            if self.name == "relay" and first is not None and first[0] >= start[0]:
                trace.rows.append(("relay->first byte", first[0] - start[0], first[1] - start[1]))
                trace.mark = first
            trace.row(self.name)


def install() -> None:
    """Wrap the router's classes (before ``runtime.gateway`` runs)."""
    _wrap_request_path()
    _wrap_edges()
    _wrap_counters()


def _wrap_request_path() -> None:
    from runtime.gateway import inference  # noqa: PLC0415
    from runtime.gateway.consumers import GatewayConsumer  # noqa: PLC0415
    from runtime.gateway.http_protocol import BoundedHttpToolsProtocol  # noqa: PLC0415
    from runtime.gateway.pipeline.stage import Pipeline  # noqa: PLC0415

    pipeline_init = Pipeline.__init__

    def timed_init(self: Any, stages: Any) -> None:
        pipeline_init(self, [TimedStage(s) for s in stages])

    Pipeline.__init__ = timed_init  # type: ignore[method-assign]

    headers_complete = BoundedHttpToolsProtocol.on_headers_complete

    def stamped_headers(self: Any) -> None:
        headers_complete(self)
        scope = self.scope
        if scope is not None:
            scope[HEAD] = _now()

    BoundedHttpToolsProtocol.on_headers_complete = stamped_headers  # type: ignore[method-assign]

    consumer_call = GatewayConsumer.__call__

    async def traced_call(self: Any, scope: Any, receive: Any, send: Any) -> None:
        head = scope.get(HEAD)
        if not BOOK.on or head is None or not isinstance(self, inference.InferenceConsumer):
            await consumer_call(self, scope, receive, send)
            return
        trace = Trace(head)
        trace.row("head->task")
        TRACE.set(trace)
        STAGE.set("consumer")
        await consumer_call(self, scope, receive, send)
        BOOK.traces.append(trace)

    GatewayConsumer.__call__ = traced_call  # type: ignore[method-assign]

    serve = inference.serve

    async def traced_serve(ctx: Any, **kwargs: Any) -> None:
        trace = TRACE.get()
        if trace is None:
            await serve(ctx, **kwargs)
            return
        trace.row("task->serve")  # the body read, the context built
        await serve(ctx, **kwargs)
        trace.row("account")

    inference.serve = traced_serve


def _wrap_edges() -> None:
    from runtime.gateway.consumers import GatewayConsumer  # noqa: PLC0415
    from runtime.gateway.pipeline.context import RequestContext  # noqa: PLC0415
    from runtime.gateway.pipeline.stage import Pipeline  # noqa: PLC0415

    release_early = RequestContext.release_early

    async def traced_release_early(self: Any) -> None:
        trace = TRACE.get()
        if trace is None:
            await release_early(self)
            return
        wall, cpu = _now()
        await release_early(self)
        end_wall, end_cpu = _now()  # inside the relay row, not subtracted from it
        trace.rows.append(("(relay) end releases", end_wall - wall, end_cpu - cpu))

    RequestContext.release_early = traced_release_early  # type: ignore[method-assign]

    send_chunk = GatewayConsumer.send_chunk

    async def traced_send_chunk(self: Any, data: bytes, *, last: bool = False) -> None:
        trace = TRACE.get()
        if trace is not None and trace.first_byte is None and data:
            trace.first_byte = _now()
        await send_chunk(self, data, last=last)

    GatewayConsumer.send_chunk = traced_send_chunk  # type: ignore[method-assign]

    run = Pipeline.run

    async def traced_run(self: Any, ctx: Any) -> None:
        try:
            await run(self, ctx)
        finally:
            trace = TRACE.get()
            if trace is not None:
                trace.row("releases")  # the exit stack, after the last stage

    Pipeline.run = traced_run  # type: ignore[method-assign]


def _wrap_counters() -> None:
    from aiohttp import TCPConnector  # noqa: PLC0415
    from redis.asyncio.connection import AbstractConnection  # noqa: PLC0415

    send_packed = AbstractConnection.send_packed_command

    async def counted_send(self: Any, command: Any, check_health: bool = True) -> None:
        if BOOK.on:
            BOOK.redis[STAGE.get()] += 1
        await send_packed(self, command, check_health)

    AbstractConnection.send_packed_command = counted_send  # type: ignore[method-assign]

    create_connection = TCPConnector._create_connection

    async def counted_connect(self: Any, *args: Any, **kwargs: Any) -> Any:
        if BOOK.on:
            BOOK.connects[STAGE.get()] += 1
        return await create_connection(self, *args, **kwargs)

    TCPConnector._create_connection = counted_connect  # type: ignore[method-assign]


def _task_factory(loop: asyncio.AbstractEventLoop, coro: Coroutine[Any, Any, Any],
                  **kwargs: Any) -> asyncio.Task[Any]:  # fmt: skip
    if BOOK.on:
        BOOK.tasks[f"{STAGE.get()} ({getattr(coro, '__qualname__', '?')})"] += 1
    return asyncio.Task(coro, loop=loop, **kwargs)


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    sys.argv = ["runtime.gateway", *args]
    install()
    gc.callbacks.append(BOOK.on_gc)

    def start(_signum: int, _frame: FrameType | None) -> None:
        loop = asyncio.get_event_loop()
        if loop.get_task_factory() is None:
            loop.set_task_factory(_task_factory)  # type: ignore[arg-type]
        BOOK.start()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        BOOK.dump(out)

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    runpy.run_module("runtime.gateway", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
