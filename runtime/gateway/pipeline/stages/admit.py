"""Stage ``admit``: the tenant's RPM, TPM, concurrency, budget caps and credit escrow in Redis
(:func:`runtime.gateway.admit.admit_limits`; a batch line, marked by ``batch_line``, in the
tenant's batch lane instead); registers the settlement (:mod:`.settle`).
The ``x-ratelimit-*`` headers of what it read (:mod:`runtime.gateway.ratelimit_headers`) go
on every answer from here on: the response's (through the context's sink) and an error's."""

from __future__ import annotations

from runtime.gateway.admit import admit_limits
from runtime.gateway.bundles import AdmissionDeps
from runtime.gateway.errors import ApiError
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.pipeline.stages.settle import settle
from runtime.gateway.ratelimit_headers import Headers, ratelimit_headers


class Admit:
    name = "admit"

    def __init__(self, deps: AdmissionDeps) -> None:
        self._deps = deps

    async def __call__(self, ctx: RequestContext) -> None:
        deps = self._deps
        principal = ctx.ready_principal
        ctx.admission = await admit_limits(
            deps, ctx.ready_snapshot, principal.tenant, ctx.ready_plan,
            batch_line=bool(ctx.batch_line), batch=principal.key.batch,
        )  # fmt: skip
        ctx.hold("settle", lambda: settle(deps, ctx), early=True)
        rates = ctx.ready_admission.lease.rates
        if rates is not None:
            headers = ratelimit_headers(rates)
            ctx.response_headers.extend(headers)
            ctx.on_failure(lambda error: _on_error(error, headers))
        ctx.wait_before_end(deps.limits.slot_writes)  # the freed slot is in Redis at the end


async def _on_error(error: BaseException, headers: Headers) -> None:
    """A refusal after admission (the queue's 429s, a 504, an upstream error) carries the
    headers too."""
    if isinstance(error, ApiError):
        error.headers = (*error.headers, *headers)
