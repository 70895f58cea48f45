"""Writes to billing: price sheets, credit grants, budgets and the usage ledger.

Prices, overdraft settings and budget caps are in the runtime snapshot (a change republishes
it); balances are not: the routers keep them in Redis (see :mod:`apps.billing.ledger` for the
model), and a grant moves the Redis balance as soon as it commits.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from types import MappingProxyType
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.core.validators import URLValidator
from django.db import transaction
from redis.exceptions import RedisError

from apps.billing import ledger
from apps.billing.models import CREDITS, Budget, CreditAccount, Price, UsageRecord
from apps.common.audit import audit_record
from apps.common.changes import audited_update, audited_upsert
from apps.common.validation import decimal_error, fits_error, is_int, raise_if, to_decimal
from apps.models.models import Endpoint, ModelVersion
from apps.models.validators import TIER_RE
from apps.tenants.models import ApiKey, Tenant

logger = logging.getLogger(__name__)

PRICE_FIELDS = (
    "version_id",
    "hardware_tier",
    "input_per_1k",
    "output_per_1k",
    "cache_hit_discount",
    "batch_discount",
)
_CREDIT_DIGITS: Mapping[str, int] = MappingProxyType(
    {"max_digits": int(CREDITS["max_digits"]), "decimal_places": int(CREDITS["decimal_places"])}
)


def _credits_error(value: object) -> str | None:
    return decimal_error(value, **_CREDIT_DIGITS)


# --- prices ---------------------------------------------------------------------------------


def _fraction_error(value: Decimal | int | str, what: str) -> str | None:
    fraction = to_decimal(value)
    if fraction is None or not 0 <= fraction <= 1:
        return f"{what} must be a fraction from 0 to 1."
    return fits_error(fraction, max_digits=4, decimal_places=3)


def price_validate(
    *,
    hardware_tier: str,
    input_per_1k: Decimal | int | str,
    output_per_1k: Decimal | int | str,
    cache_hit_discount: Decimal | int | str,
    batch_discount: Decimal | int | str = 0,
) -> None:
    tier_ok = isinstance(hardware_tier, str) and TIER_RE.fullmatch(hardware_tier)
    raise_if(
        {
            "hardware_tier": None
            if tier_ok
            else "Hardware tier must be 1-32 lowercase characters, e.g. h100, cpu.",
            "input_per_1k": _credits_error(input_per_1k),
            "output_per_1k": _credits_error(output_per_1k),
            "cache_hit_discount": _fraction_error(cache_hit_discount, "Cache-hit discount"),
            "batch_discount": _fraction_error(batch_discount, "Batch discount"),
        }
    )


def price_set(
    *,
    actor: AbstractBaseUser | None,
    version: ModelVersion,
    hardware_tier: str,
    input_per_1k: Decimal | int | str,
    output_per_1k: Decimal | int | str,
    cache_hit_discount: Decimal | int | str = Decimal("0.5"),
    batch_discount: Decimal | int | str = Decimal(0),
) -> Price:
    """Set the credits per 1k tokens of ``version`` on ``hardware_tier`` (create or replace).
    ``batch_discount`` is the fraction taken off the lines of Batch API batches."""
    price_validate(
        hardware_tier=hardware_tier,
        input_per_1k=input_per_1k,
        output_per_1k=output_per_1k,
        cache_hit_discount=cache_hit_discount,
        batch_discount=batch_discount,
    )
    values = {
        "input_per_1k": to_decimal(input_per_1k),
        "output_per_1k": to_decimal(output_per_1k),
        "cache_hit_discount": to_decimal(cache_hit_discount),
        "batch_discount": to_decimal(batch_discount),
    }
    with transaction.atomic():
        return audited_upsert(
            actor=actor,
            action="price.set",
            model=Price,
            lookup={"version": version, "hardware_tier": hardware_tier},
            values=values,
            fields=PRICE_FIELDS,
        )


# --- credits and budgets --------------------------------------------------------------------


def credit_grant_validate(*, tenant: Tenant, amount: Decimal | int | str, reason: str) -> Decimal:
    """Check a grant against the current balance; returns the amount as a Decimal."""
    number = to_decimal(amount)
    raise_if(
        {
            "amount": "Amount must be a number."
            if number is None
            else (
                "Amount must not be zero."
                if number == 0
                else fits_error(abs(number), **_CREDIT_DIGITS)
            ),
            "reason": None
            if isinstance(reason, str) and reason.strip()
            else "Give a reason for the grant.",
        }
    )
    if number is None:  # unreachable after raise_if; narrows the type
        raise ValidationError({"amount": "Amount must be a number."})
    account = CreditAccount.objects.filter(tenant=tenant).first()
    _balance_check(tenant, account.balance if account is not None else Decimal(0), number)
    return number


def _balance_check(tenant: Tenant, balance: Decimal, amount: Decimal) -> None:
    after = balance + amount
    if after < 0:
        raise ValidationError(
            {
                "amount": f"A correction of {amount} would leave tenant {tenant.slug!r} with "
                f"{after} credits; the balance is {balance} and may not go below 0."
            }
        )
    if fits_error(after, **_CREDIT_DIGITS):
        raise ValidationError({"amount": "The balance would exceed the largest amount held."})


def credit_grant(
    *, actor: AbstractBaseUser | None, tenant: Tenant, amount: Decimal | int | str, reason: str
) -> CreditAccount:
    """Add ``amount`` credits to the tenant's account (negative to correct a mistake).

    The balance never goes below zero. The grant and its reason go to the audit log.
    """
    number = credit_grant_validate(tenant=tenant, amount=amount, reason=reason)
    client = ledger.redis_client()
    account: CreditAccount | None = None
    try:
        with ledger.ledger_locked(client):
            account = _credit_grant_commit(actor=actor, tenant=tenant, number=number, reason=reason)
            if transaction.get_connection().in_atomic_block:  # the caller's commit decides
                transaction.on_commit(lambda: _redis_add_later(tenant, number))
            else:
                ledger.redis_balance_add(client, tenant=tenant, amount=number)
    except (RedisError, OSError, TimeoutError) as exc:
        # Redis is away (or the lock is busy): the ledger is the truth and the periodic
        # reconciliation moves the Redis balance by what it missed.
        logger.warning("credit grant to %s: Redis balance not updated (%r)", tenant.slug, exc)
        if account is None:
            account = _credit_grant_commit(actor=actor, tenant=tenant, number=number, reason=reason)
    finally:
        client.close()
    return account


def _redis_add_later(tenant: Tenant, amount: Decimal) -> None:
    client = ledger.redis_client()
    try:
        ledger.redis_balance_add(client, tenant=tenant, amount=amount)
    except (RedisError, OSError) as exc:
        logger.warning("credit grant to %s: Redis balance not updated (%r)", tenant.slug, exc)
    finally:
        client.close()


def credit_overdraft_set(
    *, actor: AbstractBaseUser | None, tenant: Tenant, overdraft: str
) -> CreditAccount:
    """What happens when the balance does not cover a request: "refuse" (402) or "batch"
    (admitted at the lowest band as best effort, charged only what the balance holds)."""
    if overdraft not in CreditAccount.Overdraft.values:
        raise ValidationError(
            {"overdraft": f"Overdraft must be one of {CreditAccount.Overdraft.values}."}
        )
    with transaction.atomic():
        CreditAccount.objects.get_or_create(tenant=tenant)
        account = CreditAccount.objects.select_for_update().get(tenant=tenant)
        audited_update(
            actor=actor,
            action="credit.overdraft",
            target=account,
            changes={"overdraft": overdraft},
        )
    return account


def _credit_grant_commit(
    *, actor: AbstractBaseUser | None, tenant: Tenant, number: Decimal, reason: str
) -> CreditAccount:
    with transaction.atomic():
        CreditAccount.objects.get_or_create(tenant=tenant)
        account = CreditAccount.objects.select_for_update().get(tenant=tenant)
        before = account.balance
        _balance_check(tenant, before, number)  # again, under the row lock
        account.balance = before + number
        account.save(update_fields=["balance", "updated_at"])
        audit_record(
            actor=actor,
            action="credit.grant",
            target=account,
            before={"balance": before},
            after={"balance": account.balance, "amount": number, "reason": reason.strip()},
        )
    return account


def budget_validate(*, period: str, soft_alert_pct: int, hard_cap: Decimal | int | str) -> None:
    cap = to_decimal(hard_cap)
    cap_error = _credits_error(hard_cap) or (None if cap else "Hard cap must be greater than 0.")
    raise_if(
        {
            "period": None
            if period in Budget.Period.values
            else f"Period must be one of {Budget.Period.values}.",
            "soft_alert_pct": None
            if is_int(soft_alert_pct) and 1 <= soft_alert_pct <= 100
            else "Soft alert must be a whole percentage from 1 to 100.",
            "hard_cap": cap_error,
        }
    )


def budget_set(
    *,
    actor: AbstractBaseUser | None,
    tenant: Tenant,
    period: str,
    soft_alert_pct: int,
    hard_cap: Decimal | int | str,
    webhook_url: str = "",
) -> Budget:
    """Set the tenant's budget for ``period`` (day or month), creating or replacing it. The
    hard cap reaches the routers with the snapshot (402 ``budget_exceeded`` at admission)."""
    budget_validate(period=period, soft_alert_pct=soft_alert_pct, hard_cap=hard_cap)
    if webhook_url:
        try:
            URLValidator(schemes=["http", "https"])(webhook_url)
        except ValidationError:
            raise ValidationError({"webhook_url": "Webhook URL must be an http(s) URL."}) from None
    fields = ("period", "soft_alert_pct", "hard_cap", "webhook_url")
    values = {
        "soft_alert_pct": soft_alert_pct,
        "hard_cap": to_decimal(hard_cap),
        "webhook_url": webhook_url,
    }
    with transaction.atomic():
        return audited_upsert(
            actor=actor,
            action="budget.set",
            model=Budget,
            lookup={"tenant": tenant, "period": period},
            values=values,
            fields=fields,
        )


# --- usage ledger ---------------------------------------------------------------------------


def usage_record_validate(values: dict[str, Any]) -> None:
    errors: dict[str, Any] = {}
    event_id = values["event_id"]
    if not isinstance(event_id, str) or not event_id.strip() or len(event_id) > 64:
        errors["event_id"] = "Event id must be a non-empty string of at most 64 characters."
    request_class = values["request_class"]
    if not isinstance(request_class, str) or not request_class or len(request_class) > 40:
        errors["request_class"] = "Request class must be a non-empty name of at most 40 characters."
    for field in ("tokens_in", "tokens_out"):
        if not is_int(values[field]) or not 0 <= values[field] < 2**31:
            errors[field] = "Token counts must be non-negative integers."
    errors["credits"] = _credits_error(values["credits"])
    for field in ("queue_ms", "ttft_ms", "total_ms"):
        value = values[field]
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0
        ):
            errors[field] = "Timings must be non-negative numbers of milliseconds."
    if values["outcome"] not in UsageRecord.Outcome.values:
        errors["outcome"] = f"Outcome must be one of {UsageRecord.Outcome.values}."
    occurred_at = values["occurred_at"]
    if not isinstance(occurred_at, datetime) or occurred_at.tzinfo is None:
        errors["occurred_at"] = "Occurred-at must be a timezone-aware datetime."
    raise_if(errors)


def usage_record_create(
    *,
    event_id: str,
    tenant: Tenant,
    api_key: ApiKey | None = None,
    version: ModelVersion | None = None,
    endpoint: Endpoint | None = None,
    request_class: str,
    tokens_in: int,
    tokens_out: int,
    credits: Decimal | int | str,
    cached: bool,
    queue_ms: float | None = None,
    ttft_ms: float | None = None,
    total_ms: float | None = None,
    outcome: str,
    occurred_at: datetime,
) -> tuple[UsageRecord, bool]:
    """Write one usage event to the ledger, exactly once.

    Idempotent on ``event_id``: a replay returns the existing record and ``False``. The ledger
    is itself the append-only record, so no audit event is written.
    """
    values: dict[str, Any] = {
        "event_id": event_id,
        "request_class": request_class,
        "tokens_in": tokens_in,
        "tokens_out": tokens_out,
        "credits": credits,
        "queue_ms": queue_ms,
        "ttft_ms": ttft_ms,
        "total_ms": total_ms,
        "outcome": outcome,
        "occurred_at": occurred_at,
    }
    usage_record_validate(values)
    if api_key is not None and api_key.tenant_id != tenant.pk:
        raise ValidationError({"api_key": f"API key {api_key} does not belong to {tenant.slug!r}."})
    values["credits"] = to_decimal(credits)
    del values["event_id"]
    return UsageRecord.objects.get_or_create(
        event_id=event_id,
        defaults={
            **values,
            "tenant": tenant,
            "api_key": api_key,
            "version": version,
            "endpoint": endpoint,
            "cached": bool(cached),
        },
    )
