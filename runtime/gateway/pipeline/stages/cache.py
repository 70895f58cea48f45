"""Stages ``idempotency`` and ``cache``: the request's cache job (an ``Idempotency-Key``'s
claim or stored answer), then the lookup (a hit skips the pool queue and is billed at the
cache-hit price). The job's finish (store a clean miss, hand it to the followers and the
idempotency record) is registered on the context: it runs once, after everything else."""

from __future__ import annotations

from runtime.cache.entry import Entry
from runtime.gateway.admit import charge_hit
from runtime.gateway.bundles import AdmissionDeps
from runtime.gateway.cache_front import HIT_HEADER, CacheFront, send_entry
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.relay import Usage


class CacheBegin:
    name = "idempotency"

    def __init__(self, front: CacheFront) -> None:
        self._front = front

    async def __call__(self, ctx: RequestContext) -> None:
        plan, principal = ctx.ready_plan, ctx.ready_principal
        request = ctx.request
        assert request is not None  # the plan stage decoded it
        job = await self._front.begin(
            route=ctx.spec.route, document=request.document, model=plan.model,
            version=plan.version, tenant=principal.tenant,
            cache_control=ctx.headers(b"cache-control"),
            idempotency=ctx.headers(b"idempotency-key"), deadline=plan.deadline,
        )  # fmt: skip
        ctx.job = job
        front, kind = self._front, ctx.spec.kind

        async def finish() -> None:
            await front.finish(job, kind=kind, streaming=plan.streaming,
                               outcome=ctx.record.outcome, usage=ctx.usage)  # fmt: skip

        ctx.hold_async(finish)
        if job.replay is not None:  # an Idempotency-Key's stored answer: served, not billed
            await send_stored(ctx, job.replay, b"idempotent-replay")
            ctx.answered = True
        elif job.hold is not None and job.retain:  # the first request of a key runs to its end
            ctx.detach = True  # without its client (zero retention keeps no answer: it need not)


class CacheLookup:
    name = "cache"

    def __init__(self, front: CacheFront, admission: AdmissionDeps) -> None:
        self._front = front
        self._admission = admission

    async def __call__(self, ctx: RequestContext) -> None:
        plan = ctx.ready_plan
        job = ctx.ready_job
        hit = await self._front.lookup(job, deadline=plan.deadline)
        if hit is None:  # a miss relays through a capturing sink when its answer is kept
            ctx.sink = self._front.sink_for(job, ctx.sink)
            return
        ctx.hit = hit
        ctx.usage = Usage(hit.usage.prompt_tokens, hit.usage.completion_tokens,
                          hit.usage.total_tokens)  # fmt: skip
        charge_hit(self._admission, ctx.ready_snapshot, ctx.ready_principal.tenant, plan,
                   ctx.ready_admission, tokens_in=ctx.usage.prompt_tokens,
                   tokens_out=ctx.usage.completion_tokens)  # fmt: skip
        await send_stored(ctx, hit, b"hit")
        ctx.answered = True


async def send_stored(ctx: RequestContext, entry: Entry, how: bytes) -> None:
    """A stored answer (a hit, a replay) to the client, through the context's sink."""
    plan, record = ctx.ready_plan, ctx.record
    record.status, record.outcome = 200, "ok"
    if ctx.screen is not None:  # screened under the packs in force now
        entry = ctx.screen.entry(entry)
    record.prompt_tokens = entry.usage.prompt_tokens
    record.completion_tokens = entry.usage.completion_tokens
    headers = [(b"x-switchyard-version", plan.version.label.encode("latin-1")),
               (HIT_HEADER, how)]  # fmt: skip
    await send_entry(ctx.sink, entry, streaming=plan.streaming,
                     include_usage=plan.include_usage, headers=headers, cut=ctx.cut)  # fmt: skip
