"""Stage ``relay``: the upstream response to the client (SSE or JSON,
:mod:`runtime.gateway.relay`), charging streamed output tokens to the tenant's fairness
counter. Its result (outcome, usage) is taken just before the last chunk goes out, so the
early releases after it (the grant, settling) bill the final usage."""

from __future__ import annotations

from runtime.gateway.errors import ApiError
from runtime.gateway.pipeline.context import Release, RequestContext
from runtime.gateway.relay import RelayResult, relay_stream, relay_unary
from runtime.telemetry.metrics import RouterMetrics


class Relay:
    name = "relay"

    def __init__(self, metrics: RouterMetrics) -> None:
        self._metrics = metrics

    async def __call__(self, ctx: RequestContext) -> None:
        plan, attempts, upstream = ctx.ready_plan, ctx.ready_attempts, ctx.upstream
        assert upstream is not None  # the dispatch stage opened it
        if plan.streaming != upstream.is_stream:
            raise ApiError.of("upstream_error", reason="it answered in the wrong framing.")
        result = ctx.relay = RelayResult()
        ended = Release("relay", lambda: _ended(ctx, result))
        ctx.before_end(ended)
        extra = ctx.version_header()
        if plan.streaming:
            await relay_stream(
                ctx.sink,
                ctx.events or upstream,
                kind=ctx.spec.kind,
                include_usage=plan.include_usage,
                headers=extra,
                metrics=self._metrics,
                labels=ctx.labels,
                on_tokens=attempts.grant.charge_output,
                cut=ctx.cut,
                result=result,
                screen=ctx.screen,
            )
        else:
            await relay_unary(ctx.sink, upstream, headers=extra, result=result, screen=ctx.screen)
        ended()


def _ended(ctx: RequestContext, result: RelayResult) -> None:
    """The relay's outcome and usage into the record, the grant and the context."""
    record = ctx.record
    record.outcome = result.outcome
    record.itl_ms = result.gaps_ms  # per-version ITL for the rollout gate
    if result.usage is not None:
        record.prompt_tokens = result.usage.prompt_tokens
        record.completion_tokens = result.usage.completion_tokens
        ctx.ready_attempts.grant.settle_output(result.usage.completion_tokens)
    ctx.usage = result.usage
