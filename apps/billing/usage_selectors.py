"""Usage reads for the REST API: filtered records and aggregates by day, model, class or key."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any

from django.db.models import Count, F, QuerySet, Sum
from django.db.models.functions import Coalesce, TruncDate

from apps.billing.models import CreditAccount, UsageRecord
from apps.common.models import AuditEvent
from apps.tenants.models import Tenant

USAGE_GROUPS = ("day", "model", "class", "key")
_GROUP_EXPR: dict[str, Any] = {
    "day": TruncDate("occurred_at"),
    "model": F("version__model__name"),
    "class": F("request_class"),
    "key": F("api_key__prefix"),
}


@dataclass(frozen=True, slots=True)
class UsageFilter:
    since: datetime | None = None
    until: datetime | None = None
    model: str | None = None
    request_class: str | None = None
    key: str | None = None


def usage_records(tenant: Tenant, usage_filter: UsageFilter) -> QuerySet[UsageRecord]:
    """The tenant's usage records matching the filter, newest first."""
    records = UsageRecord.objects.filter(tenant=tenant).select_related("api_key", "version__model")
    if usage_filter.since is not None:
        records = records.filter(occurred_at__gte=usage_filter.since)
    if usage_filter.until is not None:
        records = records.filter(occurred_at__lt=usage_filter.until)
    if usage_filter.model:
        records = records.filter(version__model__name=usage_filter.model)
    if usage_filter.request_class:
        records = records.filter(request_class=usage_filter.request_class)
    if usage_filter.key:
        records = records.filter(api_key__prefix=usage_filter.key)
    return records.order_by("-id")


def usage_summary(
    tenant: Tenant, usage_filter: UsageFilter, *, group_by: str
) -> list[dict[str, Any]]:
    """One row per group: ``group`` (a date, model name, class name or key prefix; None for
    records without one), request count, tokens in/out and credits; groups in order."""
    if group_by not in USAGE_GROUPS:
        raise ValueError(f"unknown usage group {group_by!r}")
    rows = (
        usage_records(tenant, usage_filter)
        .order_by()
        .annotate(group=_GROUP_EXPR[group_by])
        .values("group")
        .annotate(
            requests=Count("pk"),
            tokens_in=Coalesce(Sum("tokens_in"), 0),
            tokens_out=Coalesce(Sum("tokens_out"), 0),
            credits=Coalesce(Sum("credits"), Decimal(0)),
        )
        .order_by(F("group").asc(nulls_last=True))
    )
    return [{**row, "group": None if row["group"] is None else str(row["group"])} for row in rows]


def usage_rows_iter(records: QuerySet[UsageRecord]) -> Iterator[UsageRecord]:
    """Records streamed in chunks (for exports)."""
    return records.iterator(chunk_size=2000)


def credit_grants_for(tenant: Tenant) -> QuerySet[AuditEvent]:
    """The tenant's credit grants (and corrections) as recorded in the audit log, newest first."""
    account_ids = [
        str(pk) for pk in CreditAccount.objects.filter(tenant=tenant).values_list("pk", flat=True)
    ]
    return AuditEvent.objects.filter(
        action="credit.grant", target_type="billing.creditaccount", target_id__in=account_ids
    ).order_by("-id")
