"""Operator REST API for tenants: tenants (limits, classes, model entitlements, status),
request classes and the whole audit log. Staff sessions only; updates need If-Match.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.api_support import IdCursorPagination, etag_read, etag_update, validated_body
from apps.common.models import AuditEvent
from apps.tenants.api import (
    AUDIT_FILTERS,
    AuditEventSerializer,
    ManagementTokenCreateSerializer,
    ManagementTokenIssuedSerializer,
    ManagementTokenSerializer,
    audit_filter_args,
)
from apps.tenants.api_auth import IsOperator, actor_of
from apps.tenants.api_selectors import audit_events_filtered
from apps.tenants.models import RequestClass, Tenant
from apps.tenants.selectors import request_class_list, tenant_list
from apps.tenants.services import (
    REQUEST_CLASS_FIELDS,
    request_class_create,
    request_class_update,
    tenant_activate,
    tenant_create,
    tenant_suspend,
    tenant_update,
)
from apps.tenants.services.management_tokens import management_token_create

IF_MATCH = OpenApiParameter(
    "If-Match", str, OpenApiParameter.HEADER, required=True, description="ETag of your last read."
)


class OperatorApi(generics.GenericAPIView[Any]):
    permission_classes = (IsOperator,)
    pagination_class = IdCursorPagination


# --- tenants ---------------------------------------------------------------------------------


class OpsTenantSerializer(serializers.ModelSerializer[Tenant]):
    allowed_classes: Any = serializers.SlugRelatedField(
        slug_field="name", many=True, read_only=True
    )
    allowed_models: Any = serializers.SlugRelatedField(slug_field="name", many=True, read_only=True)
    default_class: Any = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )

    class Meta:
        model = Tenant
        fields = (
            "slug",
            "name",
            "status",
            "weight",
            "rpm_limit",
            "tpm_limit",
            "max_concurrency",
            "max_context_tokens",
            "max_output_tokens",
            "max_request_bytes",
            "result_cache",
            "zero_retention",
            "batch_file_retention_days",
            "allowed_classes",
            "default_class",
            "allowed_models",
            "created_at",
            "updated_at",
        )
        read_only_fields = fields


class TenantWriteSerializer(serializers.Serializer[Any]):
    """Types only: the service checks the values and answers with its own messages."""

    name = serializers.CharField(max_length=200, allow_blank=True)
    weight = serializers.FloatField(required=False)
    rpm_limit = serializers.IntegerField()
    tpm_limit = serializers.IntegerField()
    max_concurrency = serializers.IntegerField()
    max_context_tokens = serializers.IntegerField()
    max_output_tokens = serializers.IntegerField()
    max_request_bytes = serializers.IntegerField(
        required=False, help_text="Largest request body in bytes; 0: only the router's own cap."
    )
    result_cache = serializers.BooleanField(
        required=False, help_text="Serve this tenant's deterministic requests from the cache."
    )
    zero_retention = serializers.BooleanField(
        required=False,
        help_text="Keep nothing of this tenant's requests: never cached, no idempotency record, "
        "only usage metadata.",
    )
    batch_file_retention_days = serializers.IntegerField(
        required=False,
        allow_null=True,
        help_text="Days a Batch API file is kept after its creation; null: until deleted.",
    )
    allowed_classes = serializers.ListField(child=serializers.CharField(), required=False)
    default_class = serializers.CharField(required=False, allow_null=True)
    allowed_models = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="Empty: every model."
    )


class TenantCreateSerializer(TenantWriteSerializer):
    slug = serializers.CharField(max_length=63, allow_blank=True)


class TenantPatchSerializer(TenantWriteSerializer):
    status = serializers.ChoiceField(choices=Tenant.Status.choices, required=False)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, partial=True, **kwargs)


def _tenant(slug: str, for_update: bool = False) -> Tenant:
    tenants = tenant_list()
    if for_update:
        tenants = tenants.select_for_update(of=("self",))
    found = tenants.filter(slug=slug).first()
    if found is None:
        raise Http404
    return found


def _tenant_data(tenant: Tenant) -> Any:
    return OpsTenantSerializer(tenant).data


@extend_schema_view(
    get=extend_schema(
        operation_id="ops_tenants_list",
        parameters=[OpenApiParameter("status", str, enum=Tenant.Status.values)],
        tags=["ops: tenants"],
    )
)
class OpsTenantListApi(OperatorApi, generics.ListAPIView[Tenant]):
    serializer_class = OpsTenantSerializer

    def get_queryset(self) -> QuerySet[Tenant]:
        status_filter = self.request.query_params.get("status") or None
        return tenant_list(status=status_filter).prefetch_related("allowed_models").order_by("-id")

    @extend_schema(
        operation_id="ops_tenants_create",
        request=TenantCreateSerializer,
        responses={201: OpsTenantSerializer},
        tags=["ops: tenants"],
    )
    def post(self, request: Request) -> Response:
        body = validated_body(TenantCreateSerializer, request)
        tenant = tenant_create(actor=actor_of(request), **body)
        return Response(_tenant_data(_tenant(tenant.slug)), status=status.HTTP_201_CREATED)


class OpsTenantDetailApi(OperatorApi):
    serializer_class = OpsTenantSerializer

    @extend_schema(operation_id="ops_tenants_get", tags=["ops: tenants"])
    def get(self, request: Request, slug: str) -> Response:
        return etag_read(_tenant_data(_tenant(slug)))

    @extend_schema(
        operation_id="ops_tenants_update",
        parameters=[IF_MATCH],
        request=TenantPatchSerializer,
        tags=["ops: tenants"],
        description="Change name, status, weight, limits, the request-size cap, the result "
        "cache, classes or model entitlements.",
    )
    def patch(self, request: Request, slug: str) -> Response:
        body = validated_body(TenantPatchSerializer, request)
        return etag_update(
            request,
            fetch=lambda lock: _tenant(slug, lock),
            represent=_tenant_data,
            apply=lambda t: tenant_update(actor=actor_of(request), tenant=t, **body),
        )


class OpsTenantSuspendApi(OperatorApi):
    serializer_class = OpsTenantSerializer

    @extend_schema(operation_id="ops_tenants_suspend", request=None, tags=["ops: tenants"])
    def post(self, request: Request, slug: str) -> Response:
        tenant = tenant_suspend(actor=actor_of(request), tenant=_tenant(slug))
        return etag_read(_tenant_data(_tenant(tenant.slug)))


class OpsTenantActivateApi(OperatorApi):
    serializer_class = OpsTenantSerializer

    @extend_schema(operation_id="ops_tenants_activate", request=None, tags=["ops: tenants"])
    def post(self, request: Request, slug: str) -> Response:
        tenant = tenant_activate(actor=actor_of(request), tenant=_tenant(slug))
        return etag_read(_tenant_data(_tenant(tenant.slug)))


class OpsTenantTokenApi(OperatorApi):
    serializer_class = ManagementTokenIssuedSerializer

    @extend_schema(
        operation_id="ops_tenants_issue_token",
        request=ManagementTokenCreateSerializer,
        responses={201: ManagementTokenIssuedSerializer},
        tags=["ops: tenants"],
        description="Issue a management token for the tenant (e.g. its first owner token); "
        "the full token is in this response only.",
    )
    def post(self, request: Request, slug: str) -> Response:
        body = validated_body(ManagementTokenCreateSerializer, request)
        token, full = management_token_create(actor=actor_of(request), tenant=_tenant(slug), **body)
        data = {**ManagementTokenSerializer(token).data, "token": full}
        return Response(data, status=status.HTTP_201_CREATED)


# --- request classes -------------------------------------------------------------------------


class RequestClassSerializer(serializers.ModelSerializer[RequestClass]):
    class Meta:
        model = RequestClass
        fields = (*REQUEST_CLASS_FIELDS, "created_at", "updated_at")
        read_only_fields = fields


class RequestClassWriteSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=40, allow_blank=True)
    priority_band = serializers.IntegerField()
    ttft_slo_ms = serializers.IntegerField()
    deadline_ms = serializers.IntegerField()
    max_queue_length = serializers.IntegerField()
    shed_order = serializers.IntegerField()
    heartbeat_ms = serializers.IntegerField(required=False, default=5000)
    itl_slo_ms = serializers.IntegerField(required=False, default=200)


class RequestClassPatchSerializer(RequestClassWriteSerializer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, partial=True, **kwargs)


def _class(name: str, for_update: bool = False) -> RequestClass:
    classes = request_class_list()
    if for_update:
        classes = classes.select_for_update()
    found = classes.filter(name=name).first()
    if found is None:
        raise Http404
    return found


@extend_schema_view(get=extend_schema(operation_id="ops_classes_list", tags=["ops: tenants"]))
class OpsClassListApi(OperatorApi, generics.ListAPIView[RequestClass]):
    serializer_class = RequestClassSerializer

    def get_queryset(self) -> QuerySet[RequestClass]:
        return request_class_list().order_by("-id")

    @extend_schema(
        operation_id="ops_classes_create",
        request=RequestClassWriteSerializer,
        responses={201: RequestClassSerializer},
        tags=["ops: tenants"],
    )
    def post(self, request: Request) -> Response:
        body = validated_body(RequestClassWriteSerializer, request)
        created = request_class_create(actor=actor_of(request), **body)
        return Response(RequestClassSerializer(created).data, status=status.HTTP_201_CREATED)


class OpsClassDetailApi(OperatorApi):
    serializer_class = RequestClassSerializer

    @extend_schema(operation_id="ops_classes_get", tags=["ops: tenants"])
    def get(self, request: Request, name: str) -> Response:
        return etag_read(RequestClassSerializer(_class(name)).data)

    @extend_schema(
        operation_id="ops_classes_update",
        parameters=[IF_MATCH],
        request=RequestClassPatchSerializer,
        tags=["ops: tenants"],
    )
    def patch(self, request: Request, name: str) -> Response:
        body = validated_body(RequestClassPatchSerializer, request)
        renamed: list[str] = []

        def apply(request_class: RequestClass) -> None:
            request_class_update(actor=actor_of(request), request_class=request_class, **body)
            renamed.append(request_class.name)

        return etag_update(
            request,
            fetch=lambda lock: _class(renamed[-1] if renamed else name, lock),
            represent=lambda c: RequestClassSerializer(c).data,
            apply=apply,
        )


# --- the whole audit log ---------------------------------------------------------------------


@extend_schema_view(
    get=extend_schema(
        operation_id="ops_audit_list",
        parameters=AUDIT_FILTERS,
        tags=["ops: audit"],
        description="Every control-plane change, newest first, filterable.",
    )
)
class OpsAuditApi(OperatorApi, generics.ListAPIView[AuditEvent]):
    serializer_class = AuditEventSerializer

    def get_queryset(self) -> QuerySet[AuditEvent]:
        return audit_events_filtered(**audit_filter_args(self.request))
