"""Operator REST API for autoscaling: a pool's scaling settings (read; update under If-Match
through `apps.scaling.services.pool_scaling_update`) and its decisions, newest first."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.utils import OpenApiExample, extend_schema, extend_schema_view
from rest_framework import generics, serializers
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.api_support import etag_read, etag_update
from apps.models.models import ModelVersion, Pool
from apps.scaling.models import PoolScaling, ScalingDecision
from apps.scaling.selectors import pool_decisions
from apps.scaling.services import pool_scaling_get_or_create, pool_scaling_update
from apps.tenants.api_auth import actor_of
from apps.tenants.api_ops import IF_MATCH, OperatorApi

TAGS = ["ops: scaling"]


def _pool(pk: int) -> Pool:
    pool = Pool.objects.filter(pk=pk).first()
    if pool is None:
        raise Http404
    return pool


def _scaling(pk: int, for_update: bool = False) -> PoolScaling:
    scaling = pool_scaling_get_or_create(pool=_pool(pk))
    if for_update:
        return PoolScaling.objects.select_for_update().get(pk=scaling.pk)
    return scaling


class PoolScalingSerializer(serializers.ModelSerializer[PoolScaling]):
    class Meta:
        model = PoolScaling
        fields = (
            "pool",
            "enabled",
            "policy",
            "target_low",
            "target_high",
            "wait_slo_s",
            "out_cooldown_s",
            "in_cooldown_s",
            "idle_to_zero_s",
            "version",
            "last_out_at",
            "last_in_at",
            "idle_since",
        )
        read_only_fields = fields


class PoolScalingPatchSerializer(serializers.Serializer[Any]):
    """The settings an operator changes; the service validates the values."""

    enabled = serializers.BooleanField(required=False)
    policy = serializers.CharField(
        max_length=32, allow_blank=True, required=False, help_text='"gpu", "cpu" or blank.'
    )
    target_low = serializers.FloatField(required=False)
    target_high = serializers.FloatField(required=False)
    wait_slo_s = serializers.FloatField(required=False)
    out_cooldown_s = serializers.FloatField(required=False)
    in_cooldown_s = serializers.FloatField(required=False)
    idle_to_zero_s = serializers.FloatField(
        required=False, allow_null=True, help_text="Null: never scale to zero."
    )
    version = serializers.PrimaryKeyRelatedField(
        queryset=ModelVersion.objects.all(),
        required=False,
        allow_null=True,
        help_text="What the local actuator starts in a pool that never ran a replica "
        "(a published version's id), or null.",
    )


class ScalingDecisionSerializer(serializers.ModelSerializer[ScalingDecision]):
    class Meta:
        model = ScalingDecision
        fields = (
            "id",
            "created_at",
            "policy",
            "actuator",
            "action",
            "current",
            "desired",
            "reason",
            "signals",
            "promoted",
            "started",
            "stopped",
            "error",
        )
        read_only_fields = fields


SETTINGS_EXAMPLE = OpenApiExample(
    "settings",
    value={
        "pool": 3,
        "enabled": True,
        "policy": "",
        "target_low": 0.4,
        "target_high": 0.8,
        "wait_slo_s": 1.0,
        "out_cooldown_s": 5.0,
        "in_cooldown_s": 60.0,
        "idle_to_zero_s": 300.0,
        "version": 7,
        "last_out_at": 1795868400.5,
        "last_in_at": None,
        "idle_since": None,
    },
    response_only=True,
)
PATCH_EXAMPLE = OpenApiExample(
    "narrower band, never to zero",
    value={"target_low": 0.5, "target_high": 0.7, "idle_to_zero_s": None},
    request_only=True,
)
DECISION_EXAMPLE = OpenApiExample(
    "a scale-out",
    value={
        "id": 812,
        "created_at": "2026-11-22T15:00:00Z",
        "policy": "gpu",
        "actuator": "kubernetes",
        "action": "out",
        "current": 1,
        "desired": 2,
        "reason": "utilisation 0.93 above 0.80",
        "signals": {"pool": "gpu-a100", "at": 1795868400.0, "inflight": 14, "capacity": 16},
        "promoted": 0,
        "started": 1,
        "stopped": 0,
        "error": "",
    },
    response_only=True,
)


class OpsPoolScalingApi(OperatorApi):
    serializer_class = PoolScalingSerializer

    @extend_schema(
        operation_id="ops_pool_scaling_get",
        examples=[SETTINGS_EXAMPLE],
        tags=TAGS,
        description="The pool's scaling settings and history (defaults until first changed).",
    )
    def get(self, request: Request, pk: int) -> Response:
        return etag_read(PoolScalingSerializer(_scaling(pk)).data)

    @extend_schema(
        operation_id="ops_pool_scaling_update",
        parameters=[IF_MATCH],
        request=PoolScalingPatchSerializer,
        examples=[PATCH_EXAMPLE, SETTINGS_EXAMPLE],
        tags=TAGS,
        description="Change the settings; the autoscaler uses them from its next tick.",
    )
    def patch(self, request: Request, pk: int) -> Response:
        body = PoolScalingPatchSerializer(data=request.data, partial=True)
        body.is_valid(raise_exception=True)
        return etag_update(
            request,
            fetch=lambda lock: _scaling(pk, lock),
            represent=lambda s: PoolScalingSerializer(s).data,
            apply=lambda s: pool_scaling_update(
                actor=actor_of(request), scaling=s, **body.validated_data
            ),
        )


@extend_schema_view(
    get=extend_schema(
        operation_id="ops_pool_scaling_decisions_list",
        examples=[DECISION_EXAMPLE],
        tags=TAGS,
        description="The autoscaler's decisions for the pool, newest first (cursor-paginated).",
    )
)
class OpsPoolScalingDecisionListApi(OperatorApi, generics.ListAPIView[ScalingDecision]):
    serializer_class = ScalingDecisionSerializer

    def get_queryset(self) -> QuerySet[ScalingDecision]:
        return pool_decisions(pool=_pool(self.kwargs["pk"]))
