"""Stage ``degrade``: lower the request's quality before its availability
(:mod:`runtime.degradation`), between planning and admission, so the limits, the credit
escrow and the queue see the degraded request.

The primary pool's policies name the policy of the request's class; the stage measures the
pool (the queue wait in the class's band, whether the version's endpoints are all behind open
breakers or absent) and applies the decision:

- ``cap_tokens``: the body's ``max_tokens`` becomes the cap (the plan's output budget
  shrinks with it); the response says ``x-switchyard-degraded: max_tokens=N``;
- ``fallback``: the request is planned again for the model's ``fallback`` (its own version,
  caps and price); the response says ``x-switchyard-degraded: fallback=<model>``. When that
  model cannot take it (not entitled, too small a context, unavailable too) the primary
  plan stands.

Each applied decision is counted in ``switchyard_degraded_total{action, reason}``. Whenever
the model served is not the one the body named (an alias's member, a fallback), the response
says which in ``x-switchyard-model`` (the engine's body echoes it as ``model`` too).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgspec

from runtime.degradation import (
    BREAKER_OPEN,
    NO_ENDPOINT,
    Decision,
    DegradeSettings,
    DegradeSettingsError,
    Limits,
    PoolState,
)
from runtime.gateway.bundles import AdmissionDeps, PlanningDeps
from runtime.gateway.errors import ApiError
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.pipeline.stages.plan import plan_context
from runtime.gateway.plan import Plan
from runtime.gateway.schema import decode_request
from runtime.policy_names import UnknownPolicyError
from runtime.snapshot import Snapshot, VersionSnap
from runtime.upstream.breaker import BreakerBook

DEGRADED_HEADER = b"x-switchyard-degraded"
CALM = PoolState(queue_wait_s=0.0)
MODEL_HEADER = b"x-switchyard-model"


class Degrade:
    name = "degrade"

    def __init__(
        self, planning: PlanningDeps, admission: AdmissionDeps, breakers: BreakerBook
    ) -> None:
        self._planning = planning
        self._admission = admission
        self._breakers = breakers
        # pool -> (the policies parsed, their settings): parsed once per snapshot's map
        self._parsed: dict[str, tuple[Mapping[str, str], DegradeSettings]] = {}

    async def __call__(self, ctx: RequestContext) -> None:
        plan, snapshot = ctx.ready_plan, ctx.ready_snapshot
        decision, state = self._decide(ctx, snapshot, plan)
        applied = False
        if decision is not None and decision.max_tokens:
            applied = self._cap(ctx, plan, decision.max_tokens)
        elif decision is not None:
            applied = await self._fall_back(ctx, snapshot, plan, state)
        if applied and decision is not None:
            self._admission.metrics.degraded_total.labels(decision.action, decision.reason).inc()
        request = ctx.request
        served = ctx.ready_plan.model.name
        if request is not None and served != request.request.model:
            ctx.response_headers.append((MODEL_HEADER, served.encode("latin-1", "replace")))

    def _settings(self, snapshot: Snapshot, pool: str) -> DegradeSettings:
        snap = snapshot.pools.get(pool)
        policies: Mapping[str, str] = snap.policies if snap is not None else {}
        parsed = self._parsed.get(pool)
        if parsed is not None and parsed[0] is policies:
            return parsed[1]
        try:
            settings = DegradeSettings.from_policies(policies)
        except (DegradeSettingsError, UnknownPolicyError):
            settings = DegradeSettings()  # refused where written; a stale typo degrades nothing
        self._parsed[pool] = (policies, settings)
        return settings

    def _decide(
        self, ctx: RequestContext, snapshot: Snapshot, plan: Plan
    ) -> tuple[Decision | None, PoolState]:
        pool = self._admission.table.pool_of(snapshot, plan.version.id) or plan.version.scale_pool
        if not pool:
            return None, CALM
        settings = self._settings(snapshot, pool)
        klass = plan.klass
        policy = settings.policy_for(klass.name if klass is not None else "")
        if policy.name == "off":
            return None, CALM
        state = PoolState(
            queue_wait_s=self._wait(snapshot, plan, pool),
            unavailable=self._unavailable(snapshot, plan.version),
        )
        request = ctx.request
        asked = request.document.get("max_tokens") if request is not None else None
        limits = Limits(
            wait_s=settings.wait_s(klass.ttft_slo_ms if klass is not None else None),
            max_tokens=settings.max_tokens,
            asked_tokens=asked if isinstance(asked, int) and plan.max_tokens else 0,
            has_fallback=plan.model.fallback in snapshot.models,
        )
        return policy.decide(state, limits), state

    def _wait(self, snapshot: Snapshot, plan: Plan, pool: str) -> float:
        deps, klass = self._admission, plan.klass
        band = klass.priority_band if klass is not None else deps.default_band
        return deps.dispatchers.get(snapshot, pool).queue_wait_s(band)

    def _unavailable(self, snapshot: Snapshot, version: VersionSnap) -> str:
        """Why no endpoint of ``version`` can serve now (:data:`BREAKER_OPEN`,
        :data:`NO_ENDPOINT`); empty when one passes its pool's filters (ready, healthy,
        breaker closed) or one will start (scale from zero)."""
        deps = self._admission
        pool = deps.table.pool_of(snapshot, version.id)
        if pool is None:
            return "" if version.scale_pool else NO_ENDPOINT
        if deps.dispatchers.get(snapshot, pool).placement.candidates(version.id, frozenset()):
            return ""
        ready = [e for e in deps.table.endpoints(snapshot, version.id) if e.state == "ready"]
        if any(not self._breakers.available(e.id) for e in ready):
            return BREAKER_OPEN
        return "" if version.scale_pool else NO_ENDPOINT

    @staticmethod
    def _cap(ctx: RequestContext, plan: Plan, cap: int) -> bool:
        request = ctx.request
        asked = request.document.get("max_tokens") if request is not None else None
        if request is None or not isinstance(asked, int) or asked <= cap:
            return False
        request.document["max_tokens"] = cap
        plan.max_tokens = plan.max_tokens // asked * cap
        plan.body = msgspec.json.encode(request.document)
        ctx.response_headers.append((DEGRADED_HEADER, f"max_tokens={cap}".encode("ascii")))
        return True

    async def _fall_back(
        self, ctx: RequestContext, snapshot: Snapshot, primary: Plan, state: PoolState
    ) -> bool:
        """Plan the request for the fallback model; keep the primary plan when that model
        cannot take it, is unavailable too, or waits at least as long."""
        record, labels = ctx.record, ctx.labels
        kept = (record.model, record.version, record.prompt_tokens, labels.model, labels.version)
        request = decode_request(ctx.body, ctx.spec.decoder)
        try:
            plan = await plan_context(self._planning, ctx, request, primary.model.fallback)
        except ApiError:
            plan = None
        if plan is None or not self._better(snapshot, plan, state):
            (record.model, record.version, record.prompt_tokens, labels.model,
             labels.version) = kept  # fmt: skip
            return False
        ctx.request, ctx.plan = request, plan
        fallback = f"fallback={plan.model.name}".encode("latin-1", "replace")
        ctx.response_headers.append((DEGRADED_HEADER, fallback))
        return True

    def _better(self, snapshot: Snapshot, plan: Plan, primary: PoolState) -> bool:
        if self._unavailable(snapshot, plan.version):
            return False
        pool = self._admission.table.pool_of(snapshot, plan.version.id) or plan.version.scale_pool
        if primary.unavailable or not pool:
            return True
        return self._wait(snapshot, plan, pool) < primary.queue_wait_s
