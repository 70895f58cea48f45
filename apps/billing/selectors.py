"""Reads of billing: prices, balances, budgets and usage."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from typing import TypedDict

from django.db.models import Count, QuerySet, Sum
from django.db.models.functions import Coalesce

from apps.billing.models import Budget, CreditAccount, Price, UsageRecord
from apps.models.models import ModelVersion
from apps.tenants.models import Tenant


class UsageTotals(TypedDict):
    requests: int
    tokens_in: int
    tokens_out: int
    credits: Decimal


def prices_all() -> QuerySet[Price]:
    return Price.objects.select_related("version__model").order_by(
        "version__model__name", "version_id", "hardware_tier"
    )


def price_for(version: ModelVersion, hardware_tier: str) -> Price | None:
    return Price.objects.filter(version=version, hardware_tier=hardware_tier).first()


def credit_balance(tenant: Tenant) -> Decimal:
    """The tenant's credit balance in the ledger (0 when nothing was ever granted)."""
    balance = CreditAccount.objects.filter(tenant=tenant).values_list("balance", flat=True).first()
    return balance if balance is not None else Decimal(0)


def budgets_for(tenant: Tenant) -> QuerySet[Budget]:
    return Budget.objects.filter(tenant=tenant).order_by("period")


def usage_for_tenant(tenant: Tenant, since: datetime) -> QuerySet[UsageRecord]:
    """The tenant's usage records that occurred at or after ``since``, newest first."""
    return UsageRecord.objects.filter(tenant=tenant, occurred_at__gte=since).order_by(
        "-occurred_at", "-pk"
    )


def usage_totals(tenant: Tenant, since: datetime) -> UsageTotals:
    """Request count, tokens and credits of the tenant since ``since``."""
    totals = usage_for_tenant(tenant, since).aggregate(
        requests=Count("pk"),
        tokens_in=Coalesce(Sum("tokens_in"), 0),
        tokens_out=Coalesce(Sum("tokens_out"), 0),
        credits=Coalesce(Sum("credits"), Decimal(0)),
    )
    return UsageTotals(
        requests=totals["requests"],
        tokens_in=totals["tokens_in"],
        tokens_out=totals["tokens_out"],
        credits=totals["credits"],
    )


def period_starts(now: datetime | None = None) -> tuple[datetime, datetime]:
    """The starts (UTC) of the budget periods containing ``now``: (day, month)."""
    now = (now or datetime.now(tz=UTC)).astimezone(UTC)
    day = now.replace(hour=0, minute=0, second=0, microsecond=0)
    return day, day.replace(day=1)
