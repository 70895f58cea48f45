"""Stage ``dispatch``: open upstream on the granted endpoint, retrying elsewhere before the
first byte (:func:`runtime.upstream.dispatch.open_with_retry`); a torch-served unary request
goes to the coalescer instead and is answered here (:mod:`runtime.gateway.unary`). The
upstream response's close is registered on the context. An engine's 404 for a LoRA adapter
the router believed resident there (the engine restarted) reloads it and sends once more
(:func:`runtime.gateway.pipeline.stages.adapter.reload_lost_adapter`)."""

from __future__ import annotations

import math
import time
from collections.abc import Coroutine
from typing import Any

from runtime.gateway.bundles import UpstreamDeps
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.pipeline.stages.adapter import reload_lost_adapter
from runtime.gateway.unary import coalescible, dispatch_coalesced
from runtime.gateway.upstream_errors import dispatch_error
from runtime.snapshot import EndpointSnap
from runtime.upstream.dispatch import open_with_retry
from runtime.upstream.errors import UpstreamError, UpstreamHTTPError
from runtime.upstream.response import UpstreamResponse


class Dispatch:
    name = "dispatch"

    def __init__(self, deps: UpstreamDeps) -> None:
        self._deps = deps

    async def __call__(self, ctx: RequestContext) -> None:
        deps, plan, attempts = self._deps, ctx.ready_plan, ctx.ready_attempts
        if ctx.spec.coalesced and coalescible(deps, plan, attempts.grant):
            await dispatch_coalesced(deps, ctx)
            ctx.answered = True
            return
        record, labels, grant = ctx.record, ctx.labels, attempts.grant
        # Stage clocks use perf_counter: uvloop's loop.time() ticks in whole milliseconds.
        dispatched_at = time.perf_counter()
        try:
            try:
                endpoint, upstream = await self._open(ctx)
            except UpstreamHTTPError as exc:
                # An engine that restarted lost the adapter: reload it there, send once more.
                if not await reload_lost_adapter(deps.adapters, ctx, exc):
                    raise
                attempts.count = 0  # the granted endpoint again
                endpoint, upstream = await self._open(ctx)
        except UpstreamError as exc:
            raise dispatch_error(exc, model=plan.model.name) from None
        finally:
            record.attempts = attempts.count
            if attempts.count > 1:
                deps.metrics.retries_total.labels(plan.model.name).inc(attempts.count - 1)
        ctx.upstream = upstream
        ctx.hold_async(upstream.aclose)
        attempts.opened = True
        record.endpoint = labels.endpoint = str(endpoint.id)
        ttft = time.perf_counter() - dispatched_at
        deps.metrics.observe("queue", grant.waited_s, labels)
        if plan.streaming:  # a unary answer's first byte is its whole answer: no TTFT (#33)
            deps.metrics.observe("upstream_ttft", ttft, labels)
        record.timing("queue", grant.waited_s)
        record.timing("upstream_ttft", ttft)
        record.timing("ttft", time.monotonic() - record.started)  # client-side TTFT
        record.status = 200

    def _open(
        self, ctx: RequestContext
    ) -> Coroutine[Any, Any, tuple[EndpointSnap, UpstreamResponse]]:
        # open_with_retry's own coroutine: no frame of ours on each of its resumes (#27)
        deps, plan = self._deps, ctx.ready_plan
        return open_with_retry(
            ctx.ready_attempts,
            deps.client,
            deps.breakers,
            ctx.spec.upstream_path,
            plan.body,
            deadline=plan.deadline,
            rng=deps.rng,
            max_attempts=deps.retry_attempts,
            backoff_base=deps.backoff_base_s,
            backoff_cap=deps.backoff_cap_s,
            headers={"X-Request-Id": ctx.request_id, **deps.tracing.upstream_headers(ctx.record)},
            first_byte_cap=None if plan.streaming else math.inf,
        )
