"""Operator REST API for artifact signatures: the registry's trusted keys (create, read, turn
active or inactive; a key's bytes never change) and a version's signature (record one made
elsewhere: the private key never reaches the control plane). Writes through
`apps.models.services.signing`; what is signed: `runtime.signing`.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.utils import extend_schema, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.api_support import etag_read, etag_update, validated_body
from apps.models.api import VersionSerializer, _get, _versions
from apps.models.models import TrustedKey
from apps.models.services.signing import (
    model_version_sign,
    trusted_key_create,
    trusted_key_set_active,
)
from apps.tenants.api_auth import actor_of
from apps.tenants.api_ops import IF_MATCH, OperatorApi

TAGS = ["ops: registry"]


class TrustedKeySerializer(serializers.ModelSerializer[TrustedKey]):
    class Meta:
        model = TrustedKey
        fields = ("id", "name", "public_key", "active", "created_at")
        read_only_fields = fields


class TrustedKeyWriteSerializer(serializers.Serializer[Any]):
    """Types only: the service checks the name and that the key is an Ed25519 public key."""

    name = serializers.CharField(max_length=63, allow_blank=True)
    public_key = serializers.CharField(
        allow_blank=True,
        help_text="Base64 of the 32 raw bytes, or a PEM 'PUBLIC KEY' (stored as base64).",
    )
    active = serializers.BooleanField(required=False, default=True)


class TrustedKeyActiveSerializer(serializers.Serializer[Any]):
    active = serializers.BooleanField(help_text="Inactive: workers refuse its signatures.")


class SignatureWriteSerializer(serializers.Serializer[Any]):
    key = serializers.SlugRelatedField(
        slug_field="name",
        queryset=TrustedKey.objects.all(),
        help_text="Name of the trusted key that made the signature.",
    )
    signature = serializers.CharField(
        max_length=88,
        help_text="Base64 Ed25519 signature over 'switchyard-artifact-v1:<digest>'.",
    )


def _keys() -> QuerySet[TrustedKey]:
    return TrustedKey.objects.all()


@extend_schema_view(get=extend_schema(operation_id="ops_trusted_keys_list", tags=TAGS))
class OpsTrustedKeyListApi(OperatorApi, generics.ListAPIView[TrustedKey]):
    serializer_class = TrustedKeySerializer

    def get_queryset(self) -> QuerySet[TrustedKey]:
        return _keys().order_by("-id")

    @extend_schema(
        operation_id="ops_trusted_keys_create",
        request=TrustedKeyWriteSerializer,
        responses={201: TrustedKeySerializer},
        tags=TAGS,
    )
    def post(self, request: Request) -> Response:
        body = validated_body(TrustedKeyWriteSerializer, request)
        key = trusted_key_create(actor=actor_of(request), **body)
        return Response(TrustedKeySerializer(key).data, status=status.HTTP_201_CREATED)


class OpsTrustedKeyDetailApi(OperatorApi):
    serializer_class = TrustedKeySerializer

    @extend_schema(operation_id="ops_trusted_keys_get", tags=TAGS)
    def get(self, request: Request, pk: int) -> Response:
        return etag_read(TrustedKeySerializer(_get(_keys(), pk=pk)).data)

    @extend_schema(
        operation_id="ops_trusted_keys_set_active",
        parameters=[IF_MATCH],
        request=TrustedKeyActiveSerializer,
        tags=TAGS,
        description="Trust or distrust the key; workers apply it at their next start.",
    )
    def patch(self, request: Request, pk: int) -> Response:
        body = validated_body(TrustedKeyActiveSerializer, request)
        return etag_update(
            request,
            fetch=lambda lock: _get(_keys(), lock, pk=pk),
            represent=lambda k: TrustedKeySerializer(k).data,
            apply=lambda k: trusted_key_set_active(
                actor=actor_of(request), key=k, active=body["active"]
            ),
        )


class OpsVersionSignatureApi(OperatorApi):
    serializer_class = VersionSerializer

    @extend_schema(
        operation_id="ops_versions_sign",
        request=SignatureWriteSerializer,
        tags=TAGS,
        description="Record a trusted key's signature over the version's digest (checked "
        "here; a draft or a published version).",
    )
    def post(self, request: Request, pk: int) -> Response:
        version = _get(_versions(), pk=pk)
        body = validated_body(SignatureWriteSerializer, request)
        version = model_version_sign(actor=actor_of(request), version=version, **body)
        return etag_read(VersionSerializer(version).data)
