"""Stage ``postfilter``: sets up the output check the relay and the cache replay apply.

When the packs in force (found by ``prefilter``) have stop rules, it puts an
:class:`runtime.gateway.screen.OutputScreen` on the context: the relay feeds it each streamed
chunk (a sliding window, so a phrase split across chunks is caught) and, on a stop, ends the
stream with ``finish_reason: "content_filter"`` and ``[DONE]`` and closes the upstream; a unary
answer is checked before it is sent; a cached answer is screened when replayed. Each stop is an
intervention event. No stop rules: nothing is set and the relay pays nothing.
"""

from __future__ import annotations

from runtime.gateway.bundles import SafetyDeps
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.screen import OutputScreen
from runtime.safety.events import output_event
from runtime.safety.postfilter import Stop

GENERATING = ("chat", "completion")  # the routes whose answers are generated text


class Postfilter:
    name = "postfilter"

    def __init__(self, deps: SafetyDeps) -> None:
        self._deps = deps

    async def __call__(self, ctx: RequestContext) -> None:
        packs = ctx.packs
        if not packs or ctx.spec.kind not in GENERATING or not any(p.stop.active for p in packs):
            return
        plan, principal, events = ctx.ready_plan, ctx.ready_principal, self._deps.events

        def stopped(stop: Stop) -> None:
            ctx.record.outcome = "content_filter"
            events.record(output_event(stop, tenant=principal.tenant.slug,
                                       key=principal.key.prefix, model=plan.model.name,
                                       request_id=ctx.request_id))  # fmt: skip

        ctx.screen = OutputScreen(packs, kind=ctx.spec.kind, include_usage=plan.include_usage,
                                  prompt_tokens=plan.prompt_tokens, on_stop=stopped)  # fmt: skip
