"""Billing in the operator REST API: credit grants, budgets (create or replace) and prices."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.db import transaction
from django.http import Http404
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.billing.api import BalanceSerializer, BudgetSerializer
from apps.billing.models import Price
from apps.billing.selectors import budgets_for, credit_balance, prices_all
from apps.billing.services import budget_set, credit_grant, price_set
from apps.common.api_support import etag_of, if_match_check, validated_body, with_etag
from apps.models.models import ModelVersion
from apps.tenants.api_auth import actor_of
from apps.tenants.api_ops import OperatorApi
from apps.tenants.models import Tenant
from apps.tenants.selectors import tenant_get


def _tenant(slug: str) -> Tenant:
    found = tenant_get(slug)
    if found is None:
        raise Http404
    return found


class GrantCreateSerializer(serializers.Serializer[Any]):
    amount = serializers.DecimalField(max_digits=26, decimal_places=6)
    reason = serializers.CharField(max_length=500, allow_blank=True)


class OpsGrantApi(OperatorApi):
    serializer_class = BalanceSerializer

    @extend_schema(
        operation_id="ops_credit_grant",
        request=GrantCreateSerializer,
        responses={201: BalanceSerializer},
        tags=["ops: billing"],
        description="Grant credits (negative to correct); the balance never goes below 0.",
    )
    def post(self, request: Request, slug: str) -> Response:
        body = validated_body(GrantCreateSerializer, request)
        tenant = _tenant(slug)
        credit_grant(actor=actor_of(request), tenant=tenant, **body)
        data = {"balance": credit_balance(tenant), "budgets": list(budgets_for(tenant))}
        return Response(BalanceSerializer(data).data, status=status.HTTP_201_CREATED)


class BudgetSetSerializer(serializers.Serializer[Any]):
    soft_alert_pct = serializers.IntegerField()
    hard_cap = serializers.DecimalField(max_digits=26, decimal_places=6)


class OpsBudgetApi(OperatorApi):
    serializer_class = BudgetSerializer

    @extend_schema(
        operation_id="ops_budget_set",
        request=BudgetSetSerializer,
        tags=["ops: billing"],
        description="Create or replace the tenant's day or month budget. If-Match is checked "
        "when sent.",
    )
    def put(self, request: Request, slug: str, period: str) -> Response:
        body = validated_body(BudgetSetSerializer, request)
        tenant = _tenant(slug)
        with transaction.atomic():
            current = budgets_for(tenant).select_for_update().filter(period=period).first()
            if current is not None and request.headers.get("If-Match"):
                if_match_check(request, etag_of(BudgetSerializer(current).data))
            budget = budget_set(actor=actor_of(request), tenant=tenant, period=period, **body)
        data = BudgetSerializer(budget).data
        return with_etag(Response(data), data)


class PriceSerializer(serializers.ModelSerializer[Price]):
    model = serializers.CharField(source="version.model.name", read_only=True)

    class Meta:
        model = Price
        fields = (
            "id",
            "version",
            "model",
            "hardware_tier",
            "input_per_1k",
            "output_per_1k",
            "cache_hit_discount",
            "batch_discount",
            "updated_at",
        )
        read_only_fields = fields


class PriceSetSerializer(serializers.Serializer[Any]):
    version = serializers.PrimaryKeyRelatedField(queryset=ModelVersion.objects.all())
    hardware_tier = serializers.CharField(max_length=32, allow_blank=True)
    input_per_1k = serializers.DecimalField(max_digits=26, decimal_places=6)
    output_per_1k = serializers.DecimalField(max_digits=26, decimal_places=6)
    cache_hit_discount = serializers.DecimalField(
        max_digits=6, decimal_places=3, required=False, default=Decimal("0.5")
    )
    batch_discount = serializers.DecimalField(
        max_digits=6, decimal_places=3, required=False, default=Decimal(0),
        help_text="Fraction off (0..1) for the lines of Batch API batches.",
    )  # fmt: skip


@extend_schema_view(get=extend_schema(operation_id="ops_prices_list", tags=["ops: billing"]))
class OpsPriceListApi(OperatorApi, generics.ListAPIView[Price]):
    serializer_class = PriceSerializer

    def get_queryset(self) -> Any:
        return prices_all().order_by("-id")

    @extend_schema(
        operation_id="ops_price_set",
        request=PriceSetSerializer,
        responses={200: PriceSerializer},
        tags=["ops: billing"],
        description="Set (create or replace) the price of a version on a hardware tier.",
    )
    def post(self, request: Request) -> Response:
        body = validated_body(PriceSetSerializer, request)
        price = price_set(actor=actor_of(request), **body)
        return Response(PriceSerializer(price).data)
