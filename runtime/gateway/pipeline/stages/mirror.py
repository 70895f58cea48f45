"""Stage ``mirror``: offer the admitted request to the shadow mirror (a rollout's shadow
candidate gets a copy, off the request path)."""

from __future__ import annotations

from runtime.gateway.pipeline.context import RequestContext
from runtime.routing.shadow import ShadowMirror


class Mirror:
    name = "mirror"

    def __init__(self, shadow: ShadowMirror) -> None:
        self._shadow = shadow

    async def __call__(self, ctx: RequestContext) -> None:
        plan = ctx.ready_plan
        self._shadow.offer(ctx.ready_snapshot, plan.model, plan.version, ctx.spec.upstream_path,
                           plan.body, streaming=plan.streaming)  # fmt: skip
