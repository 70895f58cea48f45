"""Stage ``queue``: wait in the pool's queue for an endpoint with room
(:func:`runtime.gateway.admit.acquire_slot`); registers the grant's release (early: the
endpoint slot is free when the client sees its response end)."""

from __future__ import annotations

from runtime.gateway.admit import acquire_slot
from runtime.gateway.bundles import AdmissionDeps
from runtime.gateway.pipeline.context import Attempts, RequestContext


class Queue:
    name = "queue"

    def __init__(self, deps: AdmissionDeps) -> None:
        self._deps = deps

    async def __call__(self, ctx: RequestContext) -> None:
        grant = await acquire_slot(self._deps, ctx.ready_snapshot, ctx.ready_principal.tenant,
                                   ctx.ready_plan, ctx.ready_admission)  # fmt: skip
        ctx.grant = grant
        ctx.attempts = Attempts(grant)
        ctx.hold("grant", grant.release, early=True)
