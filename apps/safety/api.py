"""Operator REST API for safety: policy packs (list, create a version, read), attachments
(list, create, delete) and interventions (list, filterable by tenant). Thin views: the
services validate (a malformed rule is a 400 naming the rule's field, e.g.
``rules[1].patterns[0]``), audit and publish."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.api_support import validated_body
from apps.models.models import Model
from apps.safety.models import Intervention, PolicyAttachment, PolicyPack
from apps.safety.services import attachment_create, attachment_delete, pack_create
from apps.tenants.api_auth import actor_of
from apps.tenants.api_ops import OperatorApi
from apps.tenants.models import Tenant

TAGS = ["ops: safety"]


class PolicyPackSerializer(serializers.ModelSerializer[PolicyPack]):
    class Meta:
        model = PolicyPack
        fields = ("id", "name", "version", "description", "rules", "created_at")
        read_only_fields = fields


class PolicyPackWriteSerializer(serializers.Serializer[Any]):
    """Types only; the service checks the rules."""

    name = serializers.CharField(max_length=64, allow_blank=True)
    version = serializers.IntegerField(required=False, help_text="Omitted: the next version.")
    description = serializers.CharField(required=False, allow_blank=True, default="")
    rules = serializers.JSONField(help_text="A list of rules (see the safety user guide).")


class PolicyAttachmentSerializer(serializers.ModelSerializer[PolicyAttachment]):
    tenant: Any = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    model: Any = serializers.SlugRelatedField(slug_field="name", read_only=True)

    class Meta:
        model = PolicyAttachment
        fields = ("id", "pack_name", "tenant", "model", "created_at")
        read_only_fields = fields


class PolicyAttachmentWriteSerializer(serializers.Serializer[Any]):
    """A pack's name and one target: a tenant (slug) or a model (name)."""

    pack_name = serializers.CharField(max_length=64)
    tenant = serializers.SlugRelatedField(
        slug_field="slug", queryset=Tenant.objects.all(), required=False, allow_null=True
    )
    model = serializers.SlugRelatedField(
        slug_field="name", queryset=Model.objects.all(), required=False, allow_null=True
    )


class InterventionSerializer(serializers.ModelSerializer[Intervention]):
    tenant: Any = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = Intervention
        fields = ("id", "occurred_at", "tenant", "api_key", "model", "request_id", "stage",
                  "action", "pack", "rule", "matches", "failed")  # fmt: skip
        read_only_fields = fields


@extend_schema_view(get=extend_schema(operation_id="ops_safety_packs_list", tags=TAGS))
class OpsPolicyPackListApi(OperatorApi, generics.ListAPIView[PolicyPack]):
    serializer_class = PolicyPackSerializer

    def get_queryset(self) -> QuerySet[PolicyPack]:
        return PolicyPack.objects.order_by("-id")

    @extend_schema(
        operation_id="ops_safety_packs_create",
        request=PolicyPackWriteSerializer,
        responses={201: PolicyPackSerializer},
        tags=TAGS,
    )
    def post(self, request: Request) -> Response:
        body = validated_body(PolicyPackWriteSerializer, request)
        pack = pack_create(actor=actor_of(request), **body)
        return Response(PolicyPackSerializer(pack).data, status=status.HTTP_201_CREATED)


@extend_schema_view(get=extend_schema(operation_id="ops_safety_packs_get", tags=TAGS))
class OpsPolicyPackDetailApi(OperatorApi, generics.RetrieveAPIView[PolicyPack]):
    serializer_class = PolicyPackSerializer
    queryset = PolicyPack.objects.all()


@extend_schema_view(get=extend_schema(operation_id="ops_safety_attachments_list", tags=TAGS))
class OpsPolicyAttachmentListApi(OperatorApi, generics.ListAPIView[PolicyAttachment]):
    serializer_class = PolicyAttachmentSerializer

    def get_queryset(self) -> QuerySet[PolicyAttachment]:
        return PolicyAttachment.objects.select_related("tenant", "model").order_by("-id")

    @extend_schema(
        operation_id="ops_safety_attachments_create",
        request=PolicyAttachmentWriteSerializer,
        responses={201: PolicyAttachmentSerializer},
        tags=TAGS,
    )
    def post(self, request: Request) -> Response:
        body = validated_body(PolicyAttachmentWriteSerializer, request)
        attachment = attachment_create(
            actor=actor_of(request),
            pack_name=body["pack_name"],
            tenant=body.get("tenant"),
            model=body.get("model"),
        )
        return Response(PolicyAttachmentSerializer(attachment).data, status=status.HTTP_201_CREATED)


class OpsPolicyAttachmentDetailApi(OperatorApi):
    serializer_class = PolicyAttachmentSerializer

    @extend_schema(operation_id="ops_safety_attachments_delete", responses={204: None},
                   tags=TAGS)  # fmt: skip
    def delete(self, request: Request, pk: int) -> Response:
        attachment = PolicyAttachment.objects.filter(pk=pk).first()
        if attachment is None:
            raise Http404
        attachment_delete(actor=actor_of(request), attachment=attachment)
        return Response(status=status.HTTP_204_NO_CONTENT)


@extend_schema_view(
    get=extend_schema(
        operation_id="ops_safety_interventions_list",
        parameters=[OpenApiParameter("tenant", str, description="A tenant's slug.")],
        tags=TAGS,
        description="Refusals, redactions and stops the routers made, newest first (no content).",
    )
)
class OpsInterventionListApi(OperatorApi, generics.ListAPIView[Intervention]):
    serializer_class = InterventionSerializer

    def get_queryset(self) -> QuerySet[Intervention]:
        found = Intervention.objects.select_related("tenant").order_by("-id")
        tenant = self.request.query_params.get("tenant")
        return found.filter(tenant__slug=tenant) if tenant else found
