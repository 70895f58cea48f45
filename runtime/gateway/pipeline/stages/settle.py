"""Step ``settle``: bill what reached an engine and give the tenant's limits back.

Registered by the ``admit`` stage as an early release of the context: it runs exactly once,
just before the response's last byte goes out (the concurrency slot is free when the client
sees the end), or when the request ends any other way.
"""

from __future__ import annotations

import time

from runtime.contract import lane_tenant
from runtime.gateway.admit import settle_cost, settle_limits
from runtime.gateway.bundles import AdmissionDeps
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.relay import Usage
from runtime.internal_principal import line_event_id
from runtime.metering.events import UsageEvent


def usage_outcome(outcome: str, usage: Usage | None) -> str:
    """The ledger's outcome: "ok" (answered with usage, a stop by the post-filter included),
    "cancelled" (the client went away), else "error" (a broken stream, a deadline, an error
    after the engine was reached)."""
    if outcome in ("", "ok", "client_disconnected") and usage is None:
        return "cancelled"
    return "ok" if outcome in ("", "ok", "content_filter") else "error"


def settle(deps: AdmissionDeps, ctx: RequestContext) -> None:
    """Bill what reached an engine: the usage, else the prompt estimate and the tokens counted
    while streaming (a cancelled or broken stream); nothing otherwise. A cache hit is billed
    its stored usage at the cache-hit price."""
    admission, plan, record = ctx.ready_admission, ctx.ready_plan, ctx.record
    attempts, usage = ctx.attempts, ctx.usage
    cached = ctx.hit is not None
    opened = cached or (attempts is not None and attempts.opened)
    if usage is not None:
        tokens_in, tokens_out = usage.prompt_tokens, usage.completion_tokens
    else:
        tokens_in = plan.prompt_tokens if opened else 0
        tokens_out = attempts.grant.charged_output if attempts is not None else 0
    event = None
    if opened:
        timings = record.timings_ms
        event = UsageEvent(
            # a batch line: one id for every try of the line, so the ledger charges it once
            id=line_event_id(ctx.batch_line) if ctx.batch_line else admission.lease.id,
            tenant=lane_tenant(admission.lease.tenant), api_key=record.api_key,
            version=plan.version.id,
            endpoint=int(record.endpoint) if record.endpoint.isdigit() else None,
            tier=admission.tier, request_class=plan.klass.name if plan.klass else "default",
            tokens_in=tokens_in, tokens_out=tokens_out, cached=cached,
            cost_uc=settle_cost(admission, served=True, tokens_in=tokens_in,
                                tokens_out=tokens_out, cached=cached),
            outcome=usage_outcome(record.outcome, usage),
            occurred_at=time.time(), queue_ms=timings.get("queue"),
            ttft_ms=timings.get("upstream_ttft") if plan.streaming else None,  # streams (#33)
            total_ms=round((time.monotonic() - record.started) * 1000.0, 3),
            request_id=record.request_id,
        )  # fmt: skip
    settle_limits(deps, admission, served=opened, tokens_in=tokens_in,
                  tokens_out=tokens_out, usage_known=usage is not None,
                  event=event, cached=cached)  # fmt: skip
