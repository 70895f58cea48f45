"""Tenant self-service REST API: the tenant, its API keys, management tokens, entitlements and
its audit log. Thin views: reads through selectors, writes through `apps.tenants.services`.

Roles: viewers read; admins manage API keys; owners manage management tokens.
"""

from __future__ import annotations

from typing import Any, cast

from django.db.models import QuerySet
from django.http import Http404
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiExample,
    OpenApiParameter,
    extend_schema,
    extend_schema_view,
)
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.api_support import IdCursorPagination, time_param, validated_body
from apps.common.models import AuditEvent
from apps.tenants.api_auth import (
    ManagementTokenAuthentication,
    TenantAccess,
    TenantRolePermission,
    access_of,
    actor_of,
)
from apps.tenants.api_selectors import (
    api_key_of_tenant,
    audit_events_filtered,
    audit_events_of_tenant,
    management_tokens_for_tenant,
)
from apps.tenants.models import ApiKey, ManagementToken, Membership
from apps.tenants.selectors import (
    api_keys_for_tenant,
    memberships_for_user,
    tenant_entitlements,
)
from apps.tenants.services import API_KEY_SCOPES, api_key_create, api_key_revoke
from apps.tenants.services.api_key_rotation import MAX_OVERLAP_S, api_key_rotate
from apps.tenants.services.management_tokens import (
    management_token_create,
    management_token_revoke,
)


class ManagementTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = ManagementTokenAuthentication
    name = "managementToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "A tenant management token, `sym_<prefix>_<secret>` (not an "
            "inference key). Issued by a tenant owner through the API.",
        }


TENANT_PARAM = OpenApiParameter("tenant", str, OpenApiParameter.PATH, description="Tenant slug.")


class TenantApi(generics.GenericAPIView[Any]):
    """Base of the tenant-scoped views: the tenant comes from the URL and the caller's role."""

    permission_classes = (TenantRolePermission,)
    pagination_class = IdCursorPagination
    read_role: str = Membership.Role.VIEWER
    write_role: str = Membership.Role.ADMIN

    @property
    def access(self) -> TenantAccess:
        return access_of(self.request)


# --- the tenant ------------------------------------------------------------------------------


class TenantSelfSerializer(serializers.Serializer[Any]):
    slug = serializers.CharField()
    name = serializers.CharField()
    status = serializers.CharField()
    role = serializers.ChoiceField(choices=Membership.Role.choices, help_text="Your role.")
    weight = serializers.FloatField()
    rpm_limit = serializers.IntegerField()
    tpm_limit = serializers.IntegerField()
    max_concurrency = serializers.IntegerField()
    max_context_tokens = serializers.IntegerField()
    max_output_tokens = serializers.IntegerField()


class EntitlementsSerializer(serializers.Serializer[Any]):
    classes = serializers.ListField(child=serializers.CharField(), help_text="Most urgent first.")
    default_class = serializers.CharField(allow_null=True)
    models = serializers.ListField(
        child=serializers.CharField(), help_text="Entitled models; empty means every model."
    )
    all_models = serializers.BooleanField()


class TenantSelfApi(TenantApi):
    serializer_class = TenantSelfSerializer

    @extend_schema(operation_id="tenant_get", parameters=[TENANT_PARAM], tags=["tenant"])
    def get(self, request: Request, tenant: str) -> Response:
        access = self.access
        t = access.tenant
        data = {
            field: getattr(t, field)
            for field in ("slug", "name", "status", "weight", "rpm_limit", "tpm_limit")
        } | {
            "role": access.role,
            "max_concurrency": t.max_concurrency,
            "max_context_tokens": t.max_context_tokens,
            "max_output_tokens": t.max_output_tokens,
        }
        return Response(TenantSelfSerializer(data).data)


class EntitlementsApi(TenantApi):
    serializer_class = EntitlementsSerializer

    @extend_schema(operation_id="tenant_entitlements", parameters=[TENANT_PARAM], tags=["tenant"])
    def get(self, request: Request, tenant: str) -> Response:
        t = self.access.tenant
        entitlements = tenant_entitlements(t)
        models = sorted(t.allowed_models.values_list("name", flat=True))
        data = {
            "classes": list(entitlements.classes),
            "default_class": entitlements.default_class,
            "models": models,
            "all_models": not models,
        }
        return Response(EntitlementsSerializer(data).data)


# --- API keys --------------------------------------------------------------------------------


class ApiKeySerializer(serializers.ModelSerializer[ApiKey]):
    active = serializers.SerializerMethodField()

    class Meta:
        model = ApiKey
        fields: tuple[str, ...] = (
            "prefix",
            "name",
            "scopes",
            "expires_at",
            "revoked_at",
            "last_used_at",
            "created_at",
            "active",
        )
        read_only_fields = fields

    def get_active(self, key: ApiKey) -> bool:
        return key.revoked_at is None and (
            key.expires_at is None or key.expires_at > timezone.now()
        )


class ApiKeyCreateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100, allow_blank=True)
    scopes = serializers.ListField(
        child=serializers.ChoiceField(choices=API_KEY_SCOPES), default=["inference"]
    )
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


class ApiKeyIssuedSerializer(ApiKeySerializer):
    key = serializers.CharField(help_text="The full key. Shown only in this response.")

    class Meta(ApiKeySerializer.Meta):
        fields = (*ApiKeySerializer.Meta.fields, "key")
        read_only_fields = fields


class ApiKeyRotateSerializer(serializers.Serializer[Any]):
    overlap_s = serializers.IntegerField(
        default=3600,
        min_value=0,
        max_value=MAX_OVERLAP_S,
        help_text="Seconds the old key keeps working (0: it stops at once).",
    )


_KEY_EXAMPLE = OpenApiExample(
    "issued",
    value={
        "prefix": "k3x9q2ab",
        "name": "ci",
        "scopes": ["inference"],
        "expires_at": None,
        "revoked_at": None,
        "last_used_at": None,
        "created_at": "2026-11-22T12:00:00Z",
        "active": True,
        "key": "sy_k3x9q2ab_" + "x" * 40,
    },
    response_only=True,
)


def _issued(key: ApiKey, full_key: str) -> dict[str, Any]:
    return {**ApiKeySerializer(key).data, "key": full_key}


@extend_schema_view(
    get=extend_schema(operation_id="api_keys_list", parameters=[TENANT_PARAM], tags=["api keys"])
)
class ApiKeyListApi(TenantApi, generics.ListAPIView[ApiKey]):
    serializer_class = ApiKeySerializer

    def get_queryset(self) -> QuerySet[ApiKey]:
        return api_keys_for_tenant(self.access.tenant).order_by("-id")

    @extend_schema(
        operation_id="api_keys_create",
        parameters=[TENANT_PARAM],
        request=ApiKeyCreateSerializer,
        responses={201: ApiKeyIssuedSerializer},
        examples=[_KEY_EXAMPLE],
        tags=["api keys"],
        description="Issue an inference key. The full key is in this response only.",
    )
    def post(self, request: Request, tenant: str) -> Response:
        body = validated_body(ApiKeyCreateSerializer, request)
        key, full_key = api_key_create(actor=actor_of(request), tenant=self.access.tenant, **body)
        return Response(_issued(key, full_key), status=status.HTTP_201_CREATED)


class ApiKeyItemApi(TenantApi):
    serializer_class = ApiKeySerializer

    def key(self, prefix: str) -> ApiKey:
        found = api_key_of_tenant(self.access.tenant, prefix)
        if found is None:
            raise Http404
        return found


class ApiKeyDetailApi(ApiKeyItemApi):
    @extend_schema(operation_id="api_keys_get", parameters=[TENANT_PARAM], tags=["api keys"])
    def get(self, request: Request, tenant: str, prefix: str) -> Response:
        return Response(ApiKeySerializer(self.key(prefix)).data)


class ApiKeyRevokeApi(ApiKeyItemApi):
    @extend_schema(
        operation_id="api_keys_revoke",
        parameters=[TENANT_PARAM],
        request=None,
        responses={200: ApiKeySerializer},
        tags=["api keys"],
        description="Revoke the key for good; routers refuse it from the next snapshot.",
    )
    def post(self, request: Request, tenant: str, prefix: str) -> Response:
        key = api_key_revoke(actor=actor_of(request), api_key=self.key(prefix))
        return Response(ApiKeySerializer(key).data)


class ApiKeyRotateApi(ApiKeyItemApi):
    @extend_schema(
        operation_id="api_keys_rotate",
        parameters=[TENANT_PARAM],
        request=ApiKeyRotateSerializer,
        responses={201: ApiKeyIssuedSerializer},
        examples=[_KEY_EXAMPLE],
        tags=["api keys"],
        description="Issue a successor with the same name and scopes; the old key keeps "
        "working for `overlap_s` seconds.",
    )
    def post(self, request: Request, tenant: str, prefix: str) -> Response:
        body = validated_body(ApiKeyRotateSerializer, request)
        key, full_key = api_key_rotate(actor=actor_of(request), api_key=self.key(prefix), **body)
        return Response(_issued(key, full_key), status=status.HTTP_201_CREATED)


# --- management tokens (owners) --------------------------------------------------------------


class ManagementTokenSerializer(serializers.ModelSerializer[ManagementToken]):
    class Meta:
        model = ManagementToken
        fields: tuple[str, ...] = (
            "prefix",
            "name",
            "role",
            "expires_at",
            "revoked_at",
            "last_used_at",
            "created_at",
        )
        read_only_fields = fields


class ManagementTokenCreateSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=100, allow_blank=True)
    role = serializers.ChoiceField(choices=Membership.Role.choices)
    expires_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


class ManagementTokenIssuedSerializer(ManagementTokenSerializer):
    token = serializers.CharField(help_text="The full token. Shown only in this response.")

    class Meta(ManagementTokenSerializer.Meta):
        fields = (*ManagementTokenSerializer.Meta.fields, "token")
        read_only_fields = fields


@extend_schema_view(
    get=extend_schema(operation_id="tokens_list", parameters=[TENANT_PARAM], tags=["tokens"])
)
class ManagementTokenListApi(TenantApi, generics.ListAPIView[ManagementToken]):
    serializer_class = ManagementTokenSerializer
    read_role = Membership.Role.OWNER
    write_role = Membership.Role.OWNER

    def get_queryset(self) -> QuerySet[ManagementToken]:
        return management_tokens_for_tenant(self.access.tenant)

    @extend_schema(
        operation_id="tokens_create",
        parameters=[TENANT_PARAM],
        request=ManagementTokenCreateSerializer,
        responses={201: ManagementTokenIssuedSerializer},
        tags=["tokens"],
        description="Issue a management token (REST API only, never inference).",
    )
    def post(self, request: Request, tenant: str) -> Response:
        body = validated_body(ManagementTokenCreateSerializer, request)
        token, full = management_token_create(
            actor=actor_of(request),
            tenant=self.access.tenant,
            **body,
        )
        data = {**ManagementTokenSerializer(token).data, "token": full}
        return Response(data, status=status.HTTP_201_CREATED)


class ManagementTokenRevokeApi(TenantApi):
    serializer_class = ManagementTokenSerializer
    read_role = Membership.Role.OWNER
    write_role = Membership.Role.OWNER

    @extend_schema(
        operation_id="tokens_revoke",
        parameters=[TENANT_PARAM],
        request=None,
        responses={200: ManagementTokenSerializer},
        tags=["tokens"],
    )
    def post(self, request: Request, tenant: str, prefix: str) -> Response:
        token = management_tokens_for_tenant(self.access.tenant).filter(prefix=prefix).first()
        if token is None:
            raise Http404
        token = management_token_revoke(actor=actor_of(request), token=token)
        return Response(ManagementTokenSerializer(token).data)


# --- the tenant's audit log ------------------------------------------------------------------


class AuditEventSerializer(serializers.ModelSerializer[AuditEvent]):
    class Meta:
        model = AuditEvent
        fields = (
            "id",
            "created_at",
            "actor_label",
            "action",
            "target_type",
            "target_id",
            "target_repr",
            "before",
            "after",
        )
        read_only_fields = fields


AUDIT_FILTERS = [
    OpenApiParameter("action", str, description="Exact action, or a prefix ending in '.'."),
    OpenApiParameter("target_type", str, description="e.g. tenants.apikey"),
    OpenApiParameter("target_id", str),
    OpenApiParameter("actor", str, description="Actor label: a username or token:<prefix>."),
    OpenApiParameter("since", OpenApiTypes.DATETIME, description="ISO 8601, inclusive"),
    OpenApiParameter("until", OpenApiTypes.DATETIME, description="ISO 8601, exclusive"),
]


def audit_filter_args(request: Request) -> dict[str, Any]:
    """The audit filters of the query string; a malformed time is a 400 on that parameter."""
    args: dict[str, Any] = {
        name: request.query_params.get(name) or None
        for name in ("action", "target_type", "target_id", "actor")
    }
    args["since"] = time_param(request, "since")
    args["until"] = time_param(request, "until")
    return args


@extend_schema_view(
    get=extend_schema(
        operation_id="tenant_audit_list",
        parameters=[TENANT_PARAM, *AUDIT_FILTERS],
        tags=["tenant"],
        description="Changes to the tenant and the objects it owns, newest first.",
    )
)
class TenantAuditApi(TenantApi, generics.ListAPIView[AuditEvent]):
    serializer_class = AuditEventSerializer

    def get_queryset(self) -> QuerySet[AuditEvent]:
        own = audit_events_of_tenant(self.access.tenant)
        return audit_events_filtered(own, **audit_filter_args(self.request))


# --- who am I --------------------------------------------------------------------------------


class MembershipSerializer(serializers.Serializer[Any]):
    tenant = serializers.CharField()
    role = serializers.ChoiceField(choices=Membership.Role.choices)


class MeSerializer(serializers.Serializer[Any]):
    username = serializers.CharField()
    operator = serializers.BooleanField(help_text="Staff: may use /api/v1/ops/.")
    memberships = MembershipSerializer(many=True)


class MeApi(generics.GenericAPIView[Any]):
    serializer_class = MeSerializer

    @extend_schema(operation_id="me_get", tags=["tenant"])
    def get(self, request: Request) -> Response:
        token = request.auth if isinstance(request.auth, ManagementToken) else None
        if token is not None:
            memberships = [{"tenant": token.tenant.slug, "role": token.role}]
        else:
            memberships = [
                {"tenant": m.tenant.slug, "role": m.role}
                for m in memberships_for_user(cast(int, request.user.pk))
            ]
        data = {
            "username": request.user.get_username(),
            "operator": token is None and bool(request.user.is_staff),
            "memberships": memberships,
        }
        return Response(MeSerializer(data).data)
