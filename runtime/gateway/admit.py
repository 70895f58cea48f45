"""From a plan to an endpoint slot: tenant limits and credits, then the pool queue; refusals
as HTTP.

1. :func:`admit_limits` — the tenant's RPM, TPM (debiting prompt + max_tokens), concurrency,
   hard budget caps and credit escrow in Redis (one round trip): 429 ``rate_limit_exceeded``
   / ``tokens_per_minute_exceeded`` / ``concurrency_limit_exceeded`` with ``Retry-After``;
   402 ``budget_exceeded`` / ``insufficient_credits`` saying what the worst case needs and
   what is available (``needed_credits``, ``available_credits`` in the error object). The
   worst case is the estimated prompt + ``max_tokens`` priced for the version on the hardware
   tier of the pool that serves it.
2. :func:`acquire_slot` — the pool's dispatcher: 429 ``queue_full`` or
   ``wait_exceeds_deadline`` at the door (``Retry-After`` from the drain-rate estimate, and
   ``queue_position`` and ``estimated_wait_s`` in the error object), 429 ``shed`` when a more
   important request displaced it, 504 ``deadline_exceeded`` when its deadline passed in the
   queue, 503 ``no_healthy_endpoint`` when no endpoint of its version is usable.
3. :func:`settle_limits` — after the response: concurrency released, TPM corrected with the
   actual usage, the tokens generated charged (a cancelled or broken stream too) and the
   rest of the escrow released, one usage event appended (batched, off the request path); a
   request that never reached an engine gives its RPM entry, its whole TPM debit and its
   escrow back, costs nothing and leaves no usage event.

Every refusal is counted in ``switchyard_rejections_total{reason}``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from runtime.admission.credits import NO_ASK, CreditAsk, CreditRefusedError
from runtime.admission.limits import Lease, LimitExceededError, LimitKind, Quota
from runtime.contract import batch_lane, period_fields
from runtime.gateway.bundles import AdmissionDeps
from runtime.gateway.errors import ApiError, retry_after
from runtime.gateway.plan import Plan
from runtime.gateway.ratelimit_headers import ratelimit_headers
from runtime.metering.events import UsageEvent, encode_event
from runtime.metering.pricing import MICRO, Rate, to_credits
from runtime.scheduling.grant import (
    Grant,
    NoEndpointError,
    QueueDropError,
    QueueRejectedError,
    Ticket,
)
from runtime.scheduling.interfaces import DropReason
from runtime.snapshot import Snapshot, TenantSnap, adapter_name

_LIMIT_CODES = {
    LimitKind.RPM: "rate_limit_exceeded",
    LimitKind.TPM: "tokens_per_minute_exceeded",
    LimitKind.CONCURRENCY: "concurrency_limit_exceeded",
}


_UNBOUNDED = 1 << 40  # a limit the batch lane does not apply


@dataclass(slots=True)
class Admission:
    """An admitted request's hold on its tenant's limits and credits, and its price."""

    lease: Lease
    rate: Rate | None  # None: the version has no price on its tier (free)
    tier: str


def _caps(cap: float | None) -> int:
    return -1 if cap is None else round(cap * MICRO)


def credit_ask(
    snapshot: Snapshot, tenant: TenantSnap, plan: Plan, rate: Rate | None, *, now: float
) -> CreditAsk:
    """The worst case of ``plan`` (estimated prompt + max_tokens at ``rate``) and the
    tenant's caps and overdraft setting; nothing to ask of a free request."""
    if rate is None or rate.free:
        return NO_ASK
    settings = snapshot.credits.get(tenant.slug)
    day, month = period_fields(now)
    return CreditAsk(
        need_uc=rate.cost(plan.prompt_tokens, plan.max_tokens),
        day_field=day,
        month_field=month,
        day_cap_uc=_caps(settings.day_cap) if settings is not None else -1,
        month_cap_uc=_caps(settings.month_cap) if settings is not None else -1,
        overdraft_batch=settings is not None and settings.overdraft == "batch",
    )


def _rate_of(deps: AdmissionDeps, snapshot: Snapshot, plan: Plan) -> tuple[Rate | None, str]:
    pool = snapshot.pools.get(deps.table.pool_of(snapshot, plan.version.id) or "")
    if pool is None or deps.prices.book is None:
        return None, pool.hardware_tier if pool is not None else ""
    return deps.prices.book.rate(plan.version.id, pool.hardware_tier), pool.hardware_tier


def batch_quota(deps: AdmissionDeps) -> Quota:
    """The batch lane's limits: its concurrency allowance; RPM and TPM unbounded (the lane is
    paced by its concurrency and the ``batch`` band, not by the tenant's online rates)."""
    return Quota(rpm=_UNBOUNDED, tpm=_UNBOUNDED, concurrency=deps.batch_concurrency)


async def admit_limits(
    deps: AdmissionDeps, snapshot: Snapshot, tenant: TenantSnap, plan: Plan, *,
    batch_line: bool = False, batch: bool = False,
) -> Admission:
    """Take the request's hold on ``tenant``'s limits and credits: under its online limits, or
    (``batch_line``: the executor's signed mark) under its batch lane's (:func:`batch_quota`);
    the credits are the tenant's. A Batch API line (``batch``: sent with its batch's key) is
    priced at the batch rate."""
    limits = tenant.limits
    quota = Quota(rpm=limits.rpm, tpm=limits.tpm, concurrency=limits.max_concurrency)
    subject = tenant.slug
    if batch_line:
        quota, subject = batch_quota(deps), batch_lane(tenant.slug)
    rate, tier = _rate_of(deps, snapshot, plan)
    if batch and rate is not None:
        rate = rate.for_batch()
    ask = credit_ask(snapshot, tenant, plan, rate, now=time.time())
    try:
        lease = await deps.limits.acquire(
            subject, quota, tokens=plan.prompt_tokens + plan.max_tokens, ask=ask
        )
    except LimitExceededError as exc:
        code = _LIMIT_CODES[exc.kind]
        deps.metrics.reject(code)
        headers = retry_after(exc.retry_after_header)
        if exc.rates is not None:
            headers += ratelimit_headers(exc.rates)
        raise ApiError.of(code, reason=str(exc), headers=headers) from None
    except CreditRefusedError as exc:
        code = str(exc.kind)
        deps.metrics.reject(code)
        extra = {"needed_credits": to_credits(exc.needed_uc),
                 "available_credits": to_credits(exc.available_uc)}  # fmt: skip
        raise ApiError.of(code, reason=str(exc), extra=extra) from None
    return Admission(lease=lease, rate=rate, tier=tier)


def fair_weight(tenant: TenantSnap, admission: Admission) -> float:
    """The weight the fairness counters divide by: the plan's weight over the price of the
    tokens (credits per 1k, blended as (input + output) / 3, exact for the usual output =
    2 x input), so VTC counts credits rather than raw tokens; the plan's weight for a free
    version."""
    rate = admission.rate
    if rate is None or rate.free:
        return tenant.weight
    per_1k = (rate.input_uc + rate.output_uc) / 3.0 * 1000.0 / MICRO
    return tenant.weight / per_1k


def charge_hit(
    deps: AdmissionDeps,
    snapshot: Snapshot,
    tenant: TenantSnap,
    plan: Plan,
    admission: Admission,
    *,
    tokens_in: int,
    tokens_out: int,
) -> None:
    """Charge a cache hit to the tenant's fairness counters at the hit price: the weight is
    the usual one over (1 - the price's cache-hit discount); nothing for a free hit."""
    pool = deps.table.pool_of(snapshot, plan.version.id)
    if pool is None:
        return
    discount = admission.rate.cache_hit_discount if admission.rate is not None else 0.0
    if discount >= 1.0:
        return
    klass = plan.klass
    band = klass.priority_band if klass is not None else deps.default_band
    deps.dispatchers.get(snapshot, pool).charge_bypass(
        tenant=tenant.slug, band=band, weight=fair_weight(tenant, admission) / (1.0 - discount),
        input_tokens=tokens_in, output_tokens=tokens_out,
    )  # fmt: skip


def settle_cost(
    admission: Admission, *, served: bool, tokens_in: int, tokens_out: int, cached: bool = False
) -> int:
    """What a settled request's tokens cost (micro-credits; 0 unless it reached an engine)."""
    if served and admission.rate is not None:
        return admission.rate.cost(tokens_in, tokens_out, cached=cached)
    return 0


def settle_limits(
    deps: AdmissionDeps,
    admission: Admission,
    *,
    served: bool,
    tokens_in: int,
    tokens_out: int,
    usage_known: bool,
    event: UsageEvent | None,
    cached: bool = False,
) -> None:
    """Settle ``admission``: ``served`` (it reached an engine) bills ``tokens_in`` +
    ``tokens_out`` (from the usage, else counted while streaming) and records ``event``
    (with that cost: built with :func:`settle_cost`'s, it is not copied)."""
    cost = settle_cost(admission, served=served, tokens_in=tokens_in, tokens_out=tokens_out,
                       cached=cached)  # fmt: skip
    if event is not None and served:
        if event.cost_uc != cost:
            event = msgspec.structs.replace(event, cost_uc=cost)
        event_bytes = encode_event(event)
    else:
        event_bytes = b""
    deps.limits.settle(
        admission.lease,
        actual_tokens=tokens_in + tokens_out if usage_known else None,
        served=served,
        cost_uc=cost,
        event=event_bytes,
    )


def _no_endpoint(deps: AdmissionDeps, plan: Plan, retry_s: int | None = None) -> ApiError:
    deps.metrics.reject("no_healthy_endpoint")
    if retry_s is not None:  # scale from zero: a replica starts, the deadline cannot wait
        return ApiError.of(
            "no_healthy_endpoint",
            model=plan.model.name,
            reason=f"a replica is starting and takes about {retry_s} s, longer than the "
            "request's deadline allows",
            headers=retry_after(retry_s),
        )
    return ApiError.of("no_healthy_endpoint", model=plan.model.name, reason="none is ready")


def _lowest_band(deps: AdmissionDeps, snapshot: Snapshot) -> int:
    bands = [c.priority_band for c in snapshot.classes.values()]
    return max([deps.default_band, *bands])


async def acquire_slot(
    deps: AdmissionDeps,
    snapshot: Snapshot,
    tenant: TenantSnap,
    plan: Plan,
    admission: Admission,
    *,
    on_queued: Callable[[Callable[[], int | None]], None] | None = None,
) -> Grant:
    """Wait in the pool queue for an endpoint with room (see the module docstring); a request
    admitted on overdraft waits in the lowest band and is shed first. ``on_queued`` is told
    when the request has to wait (:attr:`Ticket.on_queued`)."""
    pool = deps.table.pool_of(snapshot, plan.version.id) or plan.version.scale_pool or None
    if pool is None:
        raise _no_endpoint(deps, plan)
    klass = plan.klass
    band = klass.priority_band if klass is not None else deps.default_band
    shed_order = klass.shed_order if klass is not None else deps.default_band
    if admission.lease.overdraft:
        band, shed_order = _lowest_band(deps, snapshot), -1
    ticket = Ticket(
        tenant=tenant.slug,
        version=plan.version.id,
        input_tokens=plan.prompt_tokens,
        prefill_tokens=plan.prefill_tokens or None,
        max_output_tokens=plan.max_tokens,
        band=band,
        class_name=klass.name if klass is not None else "",
        shed_order=shed_order,
        weight=fair_weight(tenant, admission),
        deadline=plan.deadline,
        affinity_key=plan.affinity_key,
        adapter=adapter_name(plan.version) if plan.version.base_version is not None else None,
        prefix=plan.prefix,
        on_queued=on_queued,
    )
    dispatcher = deps.dispatchers.get(snapshot, pool)
    try:
        grant = await dispatcher.acquire(ticket)
    except QueueRejectedError as exc:
        rejection = exc.rejection
        code = str(rejection.reason)  # "queue_full" | "wait_exceeds_deadline"
        deps.metrics.reject(code)
        wait = rejection.estimated_wait_s
        raise ApiError.of(
            code,
            model=plan.model.name,
            reason=rejection.message,
            headers=retry_after(rejection.retry_after_s),
            extra={
                "queue_position": rejection.position,
                "estimated_wait_s": round(wait, 3) if math.isfinite(wait) else None,
            },
        ) from None
    except QueueDropError as exc:
        if exc.reason is DropReason.SHED:
            deps.metrics.reject("shed")
            raise ApiError.of(
                "shed",
                model=plan.model.name,
                reason=str(exc),
                headers=retry_after(exc.retry_after_s),
            ) from None
        deps.metrics.reject("deadline_exceeded")
        raise ApiError.of("deadline_exceeded", when=f"while it was queued: {exc}") from None
    except NoEndpointError as exc:
        raise _no_endpoint(deps, plan, exc.retry_after_s) from None
    deps.metrics.observe_queue_wait(pool, ticket.band, grant.waited_s)
    return grant
