"""Stage ``prefilter``: the input check of the policy packs in force (the tenant's, then the
model's), after ``plan`` and before anything is reserved: a refused request costs nothing.

No pack attached (the usual case) returns at once. Otherwise :func:`runtime.safety.prefilter.
prefilter` refuses (a 400 ``content_policy_violation`` naming the pack and rule, never the
text), redacts (the upstream body is the rewritten request: the engine, the cache key and the
idempotency digest see only the redacted text) or passes; then classifier rules on the input
call their model (:mod:`runtime.gateway.safety_classifier`), which, when down, fails closed
(refused) or open (passed) as the rule says. Every refusal, redaction and failure is an
intervention event (tenant, key, model, pack, rule, action; never content). The compiled packs
are kept on the context for the ``postfilter`` stage.
"""

from __future__ import annotations

import msgspec

from runtime.gateway.bundles import SafetyDeps
from runtime.gateway.errors import ApiError
from runtime.gateway.pipeline.context import RequestContext
from runtime.safety.classify import classify
from runtime.safety.events import input_events
from runtime.safety.prefilter import Verdict, prefilter, text_parts

_ENCODER = msgspec.json.Encoder()


class Prefilter:
    name = "prefilter"

    def __init__(self, deps: SafetyDeps) -> None:
        self._deps = deps

    async def __call__(self, ctx: RequestContext) -> None:
        safety = ctx.ready_snapshot.safety
        if not safety.packs:
            return
        plan, principal, request = ctx.ready_plan, ctx.ready_principal, ctx.request
        assert request is not None  # the plan stage decoded it
        packs = self._deps.packs.packs_for(safety, principal.tenant.slug, plan.model.name)
        if not packs:
            return
        ctx.packs = packs
        verdict = prefilter(packs, request.document)
        if verdict.action == "redact" and verdict.body is not None:
            request.document = verdict.body
            plan.body = _ENCODER.encode(verdict.body)
        self._report(ctx, verdict)
        if verdict.action != "refuse" and any(p.classify_input for p in packs):
            text = "\n".join(t for _, t in text_parts(request.document))
            judged = await classify(packs, text, self._deps.classifier)
            self._report(ctx, judged)
            verdict = judged if judged.action == "refuse" else verdict
        if verdict.action == "refuse":
            how = " (its classifier was unavailable)" if verdict.failed == "closed" else ""
            raise ApiError.of("content_policy_violation", pack=verdict.pack, rule=verdict.rule,
                              how=how)  # fmt: skip

    def _report(self, ctx: RequestContext, verdict: Verdict) -> None:
        principal, record = ctx.ready_principal, ctx.record
        for event in input_events(verdict, tenant=principal.tenant.slug,
                                  key=principal.key.prefix, model=record.model,
                                  request_id=ctx.request_id):  # fmt: skip
            self._deps.events.record(event)
