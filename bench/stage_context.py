"""A request context shaped as the pipeline builds it before a stage runs, for the stage
micro-benches (``bench.safety_stages``, ``bench.prefix_stages``): snapshot, principal (the
snapshot's first key), decoded chat body and a plan for ``model``'s newest version; and
:func:`cpu_us_per_call`, the timing loop those benches and ``bench.batch_line_micro`` share."""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Awaitable, Callable, Sequence

from runtime.gateway.auth import Principal
from runtime.gateway.inference import ChatCompletionsConsumer
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.plan import Plan
from runtime.gateway.schema import decode_request
from runtime.snapshot import Snapshot
from runtime.telemetry.logging import RequestRecord


class NullSink:
    """A client that takes every response and chunk and keeps nothing."""

    async def start_response(self, status: int, headers: object) -> None:
        return None

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        return None


def chat_context(
    snapshot: Snapshot, body: bytes, *, model: str, prompt_tokens: int
) -> RequestContext:
    """A chat completion's context up to its plan (a streaming plan, no class)."""
    spec = ChatCompletionsConsumer.spec
    ctx = RequestContext(spec=spec, request_id="r", body=body, headers=lambda _name: None,
                         raw_headers=(), client=NullSink(), cut=lambda: None,
                         record=RequestRecord(request_id="r", route=spec.route))  # fmt: skip
    ctx.snapshot = snapshot
    key = next(iter(snapshot.api_keys.values()))
    ctx.principal = Principal(key, snapshot.tenants[key.tenant])
    ctx.request = decode_request(body, spec.decoder)
    found = snapshot.models[model]
    ctx.plan = Plan(model=found, version=snapshot.versions[found.versions[-1]], klass=None,
                    deadline=0.0, streaming=True, include_usage=False, body=body,
                    prompt_tokens=prompt_tokens)  # fmt: skip
    ctx.record.model = model
    return ctx



def cpu_us_per_call(
    step: Callable[[RequestContext], Awaitable[object]],
    contexts: Sequence[RequestContext],
    *,
    warm: RequestContext | None = None,
) -> float:
    """CPU microseconds per ``await step(ctx)`` over ``contexts`` (built untimed, a fresh one
    per call), after one untimed call on ``warm`` when given. The garbage collector is paused
    while timing: the contexts built for the run would make the collector's time ours."""

    async def run() -> float:
        if warm is not None:
            await step(warm)
        gc.collect()
        gc.disable()
        try:
            start = time.process_time()
            for ctx in contexts:
                await step(ctx)
            return time.process_time() - start
        finally:
            gc.enable()

    loop = asyncio.new_event_loop()
    try:
        return loop.run_until_complete(run()) / len(contexts) * 1e6
    finally:
        loop.close()
