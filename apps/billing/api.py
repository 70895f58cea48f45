"""Billing in the tenant REST API: usage (records, aggregates, CSV), balance, grants and
budgets (owners set the soft alert level). Reads through selectors, writes through
`apps.billing.services`. The operator side is in `api_ops.py`.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from typing import Any

from django.db import transaction
from django.http import Http404, StreamingHttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, renderers, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.billing.models import Budget, UsageRecord
from apps.billing.selectors import budgets_for, credit_balance
from apps.billing.services import budget_set
from apps.billing.usage_selectors import (
    USAGE_GROUPS,
    UsageFilter,
    credit_grants_for,
    usage_records,
    usage_rows_iter,
    usage_summary,
)
from apps.common.api_support import etag_of, if_match_check, time_param, validated_body, with_etag
from apps.common.models import AuditEvent
from apps.tenants.api import TENANT_PARAM, TenantApi
from apps.tenants.api_auth import actor_of
from apps.tenants.models import Membership, Tenant

USAGE_FILTERS = [
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="Inclusive, ISO 8601."),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="Exclusive, ISO 8601."),
    OpenApiParameter("model", str, description="Model name."),
    OpenApiParameter("class", str, description="Request class name."),
    OpenApiParameter("key", str, description="API-key prefix."),
]


def usage_filter_of(request: Request) -> UsageFilter:
    return UsageFilter(
        since=time_param(request, "since"),
        until=time_param(request, "until"),
        model=request.query_params.get("model") or None,
        request_class=request.query_params.get("class") or None,
        key=request.query_params.get("key") or None,
    )


class UsageRecordSerializer(serializers.ModelSerializer[UsageRecord]):
    model = serializers.CharField(source="version.model.name", allow_null=True, default=None)
    version = serializers.CharField(source="version.label", allow_null=True, default=None)
    key = serializers.CharField(source="api_key.prefix", allow_null=True, default=None)

    class Meta:
        model = UsageRecord
        fields = (
            "id",
            "event_id",
            "occurred_at",
            "model",
            "version",
            "key",
            "request_class",
            "tokens_in",
            "tokens_out",
            "credits",
            "cached",
            "queue_ms",
            "ttft_ms",
            "total_ms",
            "outcome",
        )
        read_only_fields = fields


class UsageRowSerializer(serializers.Serializer[Any]):
    group = serializers.CharField(allow_null=True, help_text="Date, model, class or key prefix.")
    requests = serializers.IntegerField()
    tokens_in = serializers.IntegerField()
    tokens_out = serializers.IntegerField()
    credits = serializers.DecimalField(max_digits=26, decimal_places=6)


class UsageSummarySerializer(serializers.Serializer[Any]):
    group_by = serializers.ChoiceField(choices=USAGE_GROUPS)
    rows = UsageRowSerializer(many=True)


@extend_schema_view(
    get=extend_schema(
        operation_id="usage_records",
        parameters=[TENANT_PARAM, *USAGE_FILTERS],
        tags=["usage"],
        description="Metered requests, newest first, cursor-paginated.",
    )
)
class UsageRecordsApi(TenantApi, generics.ListAPIView[UsageRecord]):
    serializer_class = UsageRecordSerializer

    def get_queryset(self) -> Any:
        return usage_records(self.access.tenant, usage_filter_of(self.request))


class UsageSummaryApi(TenantApi):
    serializer_class = UsageSummarySerializer

    @extend_schema(
        operation_id="usage_summary",
        parameters=[
            TENANT_PARAM,
            OpenApiParameter("group_by", str, enum=USAGE_GROUPS, default="day"),
            *USAGE_FILTERS,
        ],
        tags=["usage"],
        description="Requests, tokens and credits per day, model, request class or API key.",
    )
    def get(self, request: Request, tenant: str) -> Response:
        group_by = request.query_params.get("group_by", "day")
        if group_by not in USAGE_GROUPS:
            raise serializers.ValidationError(
                {"group_by": f"Group by one of: {', '.join(USAGE_GROUPS)}."}
            )
        rows = usage_summary(self.access.tenant, usage_filter_of(request), group_by=group_by)
        return Response(UsageSummarySerializer({"group_by": group_by, "rows": rows}).data)


_CSV_FIELDS = UsageRecordSerializer.Meta.fields


class _Echo:
    def write(self, value: str) -> str:
        return value


def _csv_lines(records: Iterator[UsageRecord]) -> Iterator[str]:
    writer = csv.writer(_Echo())
    yield writer.writerow(_CSV_FIELDS)
    for record in records:
        row = UsageRecordSerializer(record).data
        yield writer.writerow(["" if row[f] is None else row[f] for f in _CSV_FIELDS])


class CsvRenderer(renderers.BaseRenderer):
    """Lets clients ask for ``Accept: text/csv``; the export streams its own body, and an
    error raised before it starts is still rendered as the JSON error document."""

    media_type = "text/csv"
    format = "csv"
    charset = "utf-8"

    def render(
        self, data: Any, accepted_media_type: str | None = None, renderer_context: Any = None
    ) -> bytes:
        return json.dumps(data).encode()


class UsageExportApi(TenantApi):
    renderer_classes = (renderers.JSONRenderer, CsvRenderer)

    @extend_schema(
        operation_id="usage_export_csv",
        parameters=[TENANT_PARAM, *USAGE_FILTERS],
        responses={(200, "text/csv"): OpenApiTypes.STR},
        tags=["usage"],
        description="The filtered usage records as CSV (header row first), streamed.",
    )
    def get(self, request: Request, tenant: str) -> StreamingHttpResponse:
        records = usage_records(self.access.tenant, usage_filter_of(request))
        response = StreamingHttpResponse(
            _csv_lines(usage_rows_iter(records)), content_type="text/csv"
        )
        response["Content-Disposition"] = f'attachment; filename="usage-{tenant}.csv"'
        return response


# --- balance, grants, budgets ----------------------------------------------------------------


class BudgetSerializer(serializers.ModelSerializer[Budget]):
    class Meta:
        model = Budget
        fields = ("period", "soft_alert_pct", "hard_cap", "updated_at")
        read_only_fields = fields


class BalanceSerializer(serializers.Serializer[Any]):
    balance = serializers.DecimalField(max_digits=26, decimal_places=6)
    budgets = BudgetSerializer(many=True)


class GrantSerializer(serializers.ModelSerializer[AuditEvent]):
    amount = serializers.SerializerMethodField()
    reason = serializers.SerializerMethodField()
    balance_after = serializers.SerializerMethodField()

    class Meta:
        model = AuditEvent
        fields = ("id", "created_at", "actor_label", "amount", "reason", "balance_after")
        read_only_fields = fields

    def get_amount(self, event: AuditEvent) -> str | None:
        return (event.after or {}).get("amount")

    def get_reason(self, event: AuditEvent) -> str | None:
        return (event.after or {}).get("reason")

    def get_balance_after(self, event: AuditEvent) -> str | None:
        return (event.after or {}).get("balance")


class BalanceApi(TenantApi):
    serializer_class = BalanceSerializer

    @extend_schema(operation_id="balance_get", parameters=[TENANT_PARAM], tags=["billing"])
    def get(self, request: Request, tenant: str) -> Response:
        t = self.access.tenant
        data = {"balance": credit_balance(t), "budgets": list(budgets_for(t))}
        return Response(BalanceSerializer(data).data)


@extend_schema_view(
    get=extend_schema(operation_id="grants_list", parameters=[TENANT_PARAM], tags=["billing"])
)
class GrantListApi(TenantApi, generics.ListAPIView[AuditEvent]):
    serializer_class = GrantSerializer

    def get_queryset(self) -> Any:
        return credit_grants_for(self.access.tenant)


class BudgetAlertSerializer(serializers.Serializer[Any]):
    soft_alert_pct = serializers.IntegerField(help_text="Alert at this % of the hard cap (1-100).")


def _budget(tenant: Tenant, period: str, *, lock: bool = False) -> Budget:
    budgets = budgets_for(tenant)
    if lock:
        budgets = budgets.select_for_update()
    found = budgets.filter(period=period).first()
    if found is None:
        raise Http404
    return found


class BudgetApi(TenantApi):
    serializer_class = BudgetSerializer
    write_role = Membership.Role.OWNER

    @extend_schema(operation_id="budget_get", parameters=[TENANT_PARAM], tags=["billing"])
    def get(self, request: Request, tenant: str, period: str) -> Response:
        data = BudgetSerializer(_budget(self.access.tenant, period)).data
        return with_etag(Response(data), data)

    @extend_schema(
        operation_id="budget_set_alert",
        parameters=[
            TENANT_PARAM,
            OpenApiParameter("If-Match", str, OpenApiParameter.HEADER, required=True),
        ],
        request=BudgetAlertSerializer,
        tags=["billing"],
        description="Owners set the soft alert level; the hard cap is the operator's.",
    )
    def patch(self, request: Request, tenant: str, period: str) -> Response:
        body = validated_body(BudgetAlertSerializer, request)
        t = self.access.tenant
        with transaction.atomic():
            budget = _budget(t, period, lock=True)
            if_match_check(request, etag_of(BudgetSerializer(budget).data))
            budget = budget_set(
                actor=actor_of(request),
                tenant=t,
                period=period,
                soft_alert_pct=body["soft_alert_pct"],
                hard_cap=budget.hard_cap,
            )
        data = BudgetSerializer(budget).data
        return with_etag(Response(data), data)
