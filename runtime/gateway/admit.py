"""From a plan to an endpoint slot: tenant limits, then the pool queue; refusals as HTTP.

1. :func:`admit_limits` — the tenant's RPM, TPM (debiting prompt + max_tokens) and
   concurrency in Redis (one round trip): 429 ``rate_limit_exceeded`` /
   ``tokens_per_minute_exceeded`` / ``concurrency_limit_exceeded`` with ``Retry-After``.
2. :func:`acquire_slot` — the pool's dispatcher: 429 ``queue_full`` or
   ``wait_exceeds_deadline`` at the door (``Retry-After`` from the drain-rate estimate, and
   ``queue_position`` and ``estimated_wait_s`` in the error object), 429 ``shed`` when a more
   important request displaced it, 504 ``deadline_exceeded`` when its deadline passed in the
   queue, 503 ``no_healthy_endpoint`` when no endpoint of its version is usable.
3. :func:`settle_limits` — after the response: concurrency released, TPM corrected with the
   actual usage (batched, off the request path); a request that never reached an engine gives
   its RPM entry and its whole TPM debit back.

Every refusal is counted in ``switchyard_rejections_total{reason}``.
"""

from __future__ import annotations

import math

from runtime.admission.limits import Lease, LimitExceededError, LimitKind, Quota
from runtime.gateway.errors import ApiError, retry_after
from runtime.gateway.plan import Plan
from runtime.gateway.state import RouterState
from runtime.scheduling.grant import (
    Grant,
    NoEndpointError,
    QueueDropError,
    QueueRejectedError,
    Ticket,
)
from runtime.scheduling.interfaces import DropReason
from runtime.snapshot import Snapshot, TenantSnap

_LIMIT_CODES = {
    LimitKind.RPM: "rate_limit_exceeded",
    LimitKind.TPM: "tokens_per_minute_exceeded",
    LimitKind.CONCURRENCY: "concurrency_limit_exceeded",
}


async def admit_limits(state: RouterState, tenant: TenantSnap, plan: Plan) -> Lease:
    limits = tenant.limits
    quota = Quota(rpm=limits.rpm, tpm=limits.tpm, concurrency=limits.max_concurrency)
    try:
        return await state.limits.acquire(
            tenant.slug, quota, tokens=plan.prompt_tokens + plan.max_tokens
        )
    except LimitExceededError as exc:
        code = _LIMIT_CODES[exc.kind]
        state.metrics.reject(code)
        raise ApiError.of(code, str(exc), headers=retry_after(exc.retry_after_header)) from None


def settle_limits(
    state: RouterState, lease: Lease, *, served: bool, actual_tokens: int | None
) -> None:
    state.limits.settle(lease, actual_tokens=actual_tokens, served=served)


def _no_endpoint(state: RouterState, plan: Plan) -> ApiError:
    state.metrics.reject("no_healthy_endpoint")
    return ApiError.of(
        "no_healthy_endpoint",
        f"No healthy endpoint is available for the model '{plan.model.name}'.",
    )


async def acquire_slot(
    state: RouterState, snapshot: Snapshot, tenant: TenantSnap, plan: Plan
) -> Grant:
    """Wait in the pool queue for an endpoint with room (see the module docstring)."""
    pool = state.table.pool_of(snapshot, plan.version.id)
    if pool is None:
        raise _no_endpoint(state, plan)
    klass = plan.klass
    ticket = Ticket(
        tenant=tenant.slug,
        version=plan.version.id,
        input_tokens=plan.prompt_tokens,
        max_output_tokens=plan.max_tokens,
        band=klass.priority_band if klass is not None else state.config.default_band,
        class_name=klass.name if klass is not None else "",
        shed_order=klass.shed_order if klass is not None else state.config.default_band,
        weight=tenant.weight,
        deadline=plan.deadline,
        affinity_key=plan.affinity_key,
    )
    dispatcher = state.dispatchers.get(snapshot, pool)
    try:
        grant = await dispatcher.acquire(ticket)
    except QueueRejectedError as exc:
        rejection = exc.rejection
        code = str(rejection.reason)  # "queue_full" | "wait_exceeds_deadline"
        state.metrics.reject(code)
        wait = rejection.estimated_wait_s
        raise ApiError.of(
            code,
            f"The model '{plan.model.name}' is overloaded: {rejection.message}.",
            headers=retry_after(rejection.retry_after_s),
            extra={
                "queue_position": rejection.position,
                "estimated_wait_s": round(wait, 3) if math.isfinite(wait) else None,
            },
        ) from None
    except QueueDropError as exc:
        if exc.reason is DropReason.SHED:
            state.metrics.reject("shed")
            raise ApiError.of(
                "shed",
                f"The model '{plan.model.name}' is overloaded: {exc}.",
                headers=retry_after(exc.retry_after_s),
            ) from None
        state.metrics.reject("deadline_exceeded")
        raise ApiError.of(
            "deadline_exceeded", f"The request's deadline passed while it was queued: {exc}."
        ) from None
    except NoEndpointError:
        raise _no_endpoint(state, plan) from None
    state.metrics.queue_wait.labels(pool, str(ticket.band)).observe(grant.waited_s)
    return grant
