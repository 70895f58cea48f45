"""The Batch API's batches in the REST API (``/api/v1/``): operators list every tenant's
batches (``ops/batches/``, filtered by tenant and status), a tenant's members their own
(``tenants/<slug>/batches/``), with progress: ``request_counts`` and ``progress``. Read-only:
batches are created and cancelled through the Batch API itself (``/v1/batches``)."""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema, extend_schema_field
from rest_framework import generics, serializers

from apps.batches.models import Batch
from apps.batches.selectors import batch_progress, batches_listed
from apps.tenants.api import TENANT_PARAM, TenantApi
from apps.tenants.api_ops import OperatorApi

TAGS = ["batches"]
STATUS_PARAM = OpenApiParameter(
    "status", str, enum=[s.value for s in Batch.Status], description="Only batches in this status."
)


class RequestCountsSerializer(serializers.Serializer[Any]):
    total = serializers.IntegerField(help_text="Lines in the input file.")
    completed = serializers.IntegerField(help_text="Lines answered (HTTP 2xx).")
    failed = serializers.IntegerField(help_text="Lines that failed, were cancelled or expired.")


class BatchSerializer(serializers.ModelSerializer[Batch]):
    id = serializers.CharField(source="public_id")
    tenant = serializers.CharField(source="tenant.slug")
    request_counts = RequestCountsSerializer(source="*")
    progress = serializers.SerializerMethodField()
    input_file_id = serializers.CharField(source="input_file.public_id", allow_null=True,
                                          default=None)  # fmt: skip
    output_file_id = serializers.CharField(source="output_file.public_id", allow_null=True,
                                           default=None)  # fmt: skip
    error_file_id = serializers.CharField(source="error_file.public_id", allow_null=True,
                                          default=None)  # fmt: skip

    class Meta:
        model = Batch
        fields = (
            "id", "tenant", "endpoint", "status", "request_counts", "progress",
            "paused_reason", "metadata", "input_file_id", "output_file_id", "error_file_id",
            "created_at", "in_progress_at", "expires_at", "completed_at", "failed_at",
            "expired_at", "cancelled_at",
        )  # fmt: skip
        read_only_fields = fields

    @extend_schema_field(OpenApiTypes.FLOAT)
    def get_progress(self, batch: Batch) -> float:
        """Finished lines (answered or failed) over all lines, 0..1."""
        return round(batch_progress(batch), 4)


def _status_of(params: Any) -> str | None:
    status = params.get("status") or None
    if status is not None and status not in Batch.Status.values:
        raise serializers.ValidationError(
            {"status": f"Status must be one of: {', '.join(Batch.Status.values)}."}
        )
    return status


class OpsBatchListApi(OperatorApi, generics.ListAPIView[Batch]):
    serializer_class = BatchSerializer

    @extend_schema(
        operation_id="ops_batches_list",
        parameters=[OpenApiParameter("tenant", str, description="A tenant's slug."), STATUS_PARAM],
        tags=TAGS,
        description="Every tenant's Batch API batches with their progress, newest first.",
    )
    def get(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[Batch]:
        params = self.request.query_params
        return batches_listed(tenant=params.get("tenant") or None, status=_status_of(params))


class TenantBatchListApi(TenantApi, generics.ListAPIView[Batch]):
    serializer_class = BatchSerializer

    @extend_schema(
        operation_id="tenant_batches_list",
        parameters=[TENANT_PARAM, STATUS_PARAM],
        tags=TAGS,
        description="The tenant's Batch API batches with their progress, newest first.",
    )
    def get(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return super().get(request, *args, **kwargs)

    def get_queryset(self) -> QuerySet[Batch]:
        return batches_listed(tenant=self.access.tenant,
                              status=_status_of(self.request.query_params))  # fmt: skip
