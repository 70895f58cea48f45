"""Stage ``admit``: the tenant's RPM, TPM, concurrency, budget caps and credit escrow in Redis
(:func:`runtime.gateway.admit.admit_limits`); registers the settlement (:mod:`.settle`)."""

from __future__ import annotations

from runtime.gateway.admit import admit_limits
from runtime.gateway.bundles import AdmissionDeps
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.pipeline.stages.settle import settle


class Admit:
    name = "admit"

    def __init__(self, deps: AdmissionDeps) -> None:
        self._deps = deps

    async def __call__(self, ctx: RequestContext) -> None:
        deps = self._deps
        ctx.admission = await admit_limits(
            deps, ctx.ready_snapshot, ctx.ready_principal.tenant, ctx.ready_plan
        )
        ctx.hold("settle", lambda: settle(deps, ctx), early=True)
        ctx.wait_before_end(deps.limits.slots_freed)  # the freed slot is in Redis at the end
