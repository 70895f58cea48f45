"""Operator REST API for rollouts: plan one, read it with its events, cancel it.

The state-machine actions (start, advance, pause, resume, promote, roll back) are queued as
Celery tasks by ``apps.rollouts.api_actions``.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.api_support import validated_body
from apps.models.models import Model, ModelVersion
from apps.rollouts.models import Rollout, RolloutEvent
from apps.rollouts.selectors import rollout_events
from apps.rollouts.services import DEFAULT_STEPS, EVENT_FIELDS, rollout_cancel, rollout_create
from apps.tenants.api_auth import actor_of
from apps.tenants.api_ops import OperatorApi


class RolloutEventSerializer(serializers.ModelSerializer[RolloutEvent]):
    class Meta:
        model = RolloutEvent
        fields = EVENT_FIELDS
        read_only_fields = fields


class RolloutSerializer(serializers.ModelSerializer[Rollout]):
    class Meta:
        model = Rollout
        fields: tuple[str, ...] = (
            "id",
            "model",
            "stable_version",
            "candidate_version",
            "mode",
            "steps",
            "current_step",
            "state",
            "max_error_rate_delta",
            "max_ttft_p95_ratio",
            "max_itl_p95_ratio",
            "max_cost_ratio",
            "step_window_s",
            "sticky_header",
            "warmup_endpoints",
            "created_at",
            "updated_at",
        )
        read_only_fields = fields


class RolloutDetailSerializer(RolloutSerializer):
    events = serializers.SerializerMethodField()

    class Meta(RolloutSerializer.Meta):
        fields = (*RolloutSerializer.Meta.fields, "events")
        read_only_fields = fields

    def get_events(self, rollout: Rollout) -> list[dict[str, Any]]:
        return list(RolloutEventSerializer(rollout_events(rollout), many=True).data)


class RolloutCreateSerializer(serializers.Serializer[Any]):
    model = serializers.PrimaryKeyRelatedField(queryset=Model.objects.all())
    stable_version = serializers.PrimaryKeyRelatedField(queryset=ModelVersion.objects.all())
    candidate_version = serializers.PrimaryKeyRelatedField(queryset=ModelVersion.objects.all())
    mode = serializers.ChoiceField(choices=Rollout.Mode.choices, default=Rollout.Mode.CANARY)
    steps = serializers.ListField(
        child=serializers.IntegerField(), required=False, default=list(DEFAULT_STEPS)
    )
    max_error_rate_delta = serializers.FloatField(required=False, default=0.01)
    max_ttft_p95_ratio = serializers.FloatField(required=False, default=1.2)
    max_itl_p95_ratio = serializers.FloatField(required=False, default=1.2)
    max_cost_ratio = serializers.FloatField(required=False, default=1.1)
    step_window_s = serializers.IntegerField(required=False, default=300)
    sticky_header = serializers.CharField(
        required=False, default="", allow_blank=True, trim_whitespace=False, max_length=200
    )


class RolloutCancelSerializer(serializers.Serializer[Any]):
    reason = serializers.CharField(max_length=2000, allow_blank=True)


def _rollouts() -> QuerySet[Rollout]:
    return Rollout.objects.select_related("model", "stable_version", "candidate_version")


def _rollout(pk: int) -> Rollout:
    found = _rollouts().filter(pk=pk).first()
    if found is None:
        raise Http404
    return found


@extend_schema_view(
    get=extend_schema(
        operation_id="ops_rollouts_list",
        parameters=[
            OpenApiParameter("state", str, enum=Rollout.State.values),
            OpenApiParameter("model", int, description="Model id."),
        ],
        tags=["ops: rollouts"],
    )
)
class OpsRolloutListApi(OperatorApi, generics.ListAPIView[Rollout]):
    serializer_class = RolloutSerializer

    def get_queryset(self) -> QuerySet[Rollout]:
        rollouts = _rollouts().order_by("-id")
        state = self.request.query_params.get("state")
        model = self.request.query_params.get("model")
        if state:
            rollouts = rollouts.filter(state=state)
        if model and model.isdigit():
            rollouts = rollouts.filter(model_id=int(model))
        return rollouts

    @extend_schema(
        operation_id="ops_rollouts_create",
        request=RolloutCreateSerializer,
        responses={201: RolloutDetailSerializer},
        tags=["ops: rollouts"],
        description="Plan a rollout (state pending). At most one active rollout per model.",
    )
    def post(self, request: Request) -> Response:
        body = validated_body(RolloutCreateSerializer, request)
        rollout = rollout_create(actor=actor_of(request), **body)
        return Response(RolloutDetailSerializer(rollout).data, status=status.HTTP_201_CREATED)


class OpsRolloutDetailApi(OperatorApi):
    serializer_class = RolloutDetailSerializer

    @extend_schema(operation_id="ops_rollouts_get", tags=["ops: rollouts"])
    def get(self, request: Request, pk: int) -> Response:
        return Response(RolloutDetailSerializer(_rollout(pk)).data)


class OpsRolloutCancelApi(OperatorApi):
    serializer_class = RolloutDetailSerializer

    @extend_schema(
        operation_id="ops_rollouts_cancel",
        request=RolloutCancelSerializer,
        tags=["ops: rollouts"],
    )
    def post(self, request: Request, pk: int) -> Response:
        body = validated_body(RolloutCancelSerializer, request)
        rollout = rollout_cancel(
            actor=actor_of(request), rollout=_rollout(pk), reason=body["reason"]
        )
        return Response(RolloutDetailSerializer(rollout).data)
