"""Stage ``plan``: decode the body, then model, class, deadline, version, caps, upstream body
(:func:`runtime.gateway.plan.plan_request`)."""

from __future__ import annotations

from typing import Any

from runtime.gateway.bundles import PlanningDeps
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.plan import Plan, plan_request
from runtime.gateway.schema import Decoded, decode_request


async def plan_context(
    deps: PlanningDeps, ctx: RequestContext, request: Decoded[Any], model_name: str | None = None
) -> Plan:
    """Plan ``request`` as ``ctx``'s request (``model_name``: served by that model instead)."""
    return await plan_request(
        deps,
        ctx.ready_snapshot,
        principal=ctx.ready_principal,
        request=request,
        route=ctx.spec.route,
        tasks=ctx.spec.tasks,
        class_header=ctx.headers(b"x-switchyard-class"),
        timeout_header=ctx.headers(b"x-request-timeout"),
        headers=ctx.raw_headers,  # a rollout's sticky header
        record=ctx.record,
        labels=ctx.labels,
        model_name=model_name,
    )


class PlanStage:
    name = "plan"

    def __init__(self, deps: PlanningDeps) -> None:
        self._deps = deps

    async def __call__(self, ctx: RequestContext) -> None:
        request = decode_request(ctx.body, ctx.spec.decoder)
        ctx.request = request
        ctx.plan = await plan_context(self._deps, ctx, request)
