"""Operator REST API for the model registry: models, versions (a published version is
immutable: updates answer 409), pools, endpoints and routes. Writes through
`apps.models.services`; updates need If-Match.
"""

from __future__ import annotations

from typing import Any

from django.db.models import QuerySet
from django.http import Http404
from drf_spectacular.utils import extend_schema, extend_schema_field, extend_schema_view
from rest_framework import generics, serializers, status
from rest_framework.request import Request
from rest_framework.response import Response

from apps.common.api_support import Conflict, etag_read, etag_update, validated_body
from apps.models.models import Endpoint, Model, ModelVersion, Pool, Route
from apps.models.selectors import models_all, routes_all
from apps.models.services import (
    endpoint_register,
    endpoint_set_state,
    model_create,
    model_update,
    model_version_create,
    model_version_publish,
    model_version_update,
    pool_create,
    pool_update,
    route_set,
)
from apps.models.services.catalog import MODEL_WRITABLE_FIELDS, VERSION_FIELDS, published_error
from apps.models.services.fleet import POOL_FIELDS
from apps.tenants.api_auth import actor_of
from apps.tenants.api_ops import IF_MATCH, OperatorApi


def _get(queryset: QuerySet[Any], for_update: bool = False, **lookup: Any) -> Any:
    if for_update:
        queryset = queryset.select_for_update(of=("self",))
    found = queryset.filter(**lookup).first()
    if found is None:
        raise Http404
    return found


class Immutable(Conflict):
    default_code = "immutable"


# --- models ----------------------------------------------------------------------------------


class ModelSerializer(serializers.ModelSerializer[Model]):
    fallback: serializers.SlugRelatedField[Model] = serializers.SlugRelatedField(
        slug_field="name", read_only=True, allow_null=True
    )

    class Meta:
        model = Model
        fields = ("id", *MODEL_WRITABLE_FIELDS, "created_at")
        read_only_fields = fields


class ModelWriteSerializer(serializers.Serializer[Any]):
    """Types only: the service checks the values (a TTL of at least 1 s, field names)."""

    name = serializers.CharField(max_length=100, allow_blank=True)
    task = serializers.ChoiceField(choices=Model.Task.choices)
    description = serializers.CharField(required=False, allow_blank=True, default="")
    refused_fields = serializers.ListField(
        child=serializers.CharField(), required=False, help_text="Request fields refused (400)."
    )
    cache_enabled = serializers.BooleanField(
        required=False, help_text="Serve deterministic requests from the result cache."
    )
    cache_shared = serializers.BooleanField(
        required=False, help_text="Share cached results across tenants (off: per tenant)."
    )
    cache_ttl_s = serializers.IntegerField(
        required=False, help_text="How long a cached result is kept, in seconds (>= 1)."
    )
    fallback = serializers.SlugRelatedField(
        slug_field="name",
        queryset=Model.objects.all(),
        required=False,
        allow_null=True,
        help_text="The model (by name) a 'fallback' degradation moves requests to; null: none.",
    )
    members = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text="An alias's member models (by name); empty: not an alias.",
    )


class ModelPatchSerializer(ModelWriteSerializer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, partial=True, **kwargs)


@extend_schema_view(get=extend_schema(operation_id="ops_models_list", tags=["ops: registry"]))
class OpsModelListApi(OperatorApi, generics.ListAPIView[Model]):
    serializer_class = ModelSerializer

    def get_queryset(self) -> QuerySet[Model]:
        return models_all().order_by("-id")

    @extend_schema(
        operation_id="ops_models_create",
        request=ModelWriteSerializer,
        responses={201: ModelSerializer},
        tags=["ops: registry"],
    )
    def post(self, request: Request) -> Response:
        body = validated_body(ModelWriteSerializer, request)
        model = model_create(actor=actor_of(request), **body)
        return Response(ModelSerializer(model).data, status=status.HTTP_201_CREATED)


class OpsModelDetailApi(OperatorApi):
    serializer_class = ModelSerializer

    @extend_schema(operation_id="ops_models_get", tags=["ops: registry"])
    def get(self, request: Request, pk: int) -> Response:
        return etag_read(ModelSerializer(_get(models_all(), pk=pk)).data)

    @extend_schema(
        operation_id="ops_models_update",
        parameters=[IF_MATCH],
        request=ModelPatchSerializer,
        tags=["ops: registry"],
    )
    def patch(self, request: Request, pk: int) -> Response:
        body = validated_body(ModelPatchSerializer, request)
        return etag_update(
            request,
            fetch=lambda lock: _get(models_all(), lock, pk=pk),
            represent=lambda m: ModelSerializer(m).data,
            apply=lambda m: model_update(actor=actor_of(request), model=m, **body),
        )


# --- versions --------------------------------------------------------------------------------


class VersionSerializer(serializers.ModelSerializer[ModelVersion]):
    model = serializers.CharField(source="model.name", read_only=True)
    published = serializers.BooleanField(source="is_published", read_only=True)
    signing_key: Any = serializers.SlugRelatedField(
        slug_field="name", read_only=True, help_text="The trusted key that signed the digest."
    )

    class Meta:
        model = ModelVersion
        fields = (
            "id",
            "model",
            *VERSION_FIELDS,
            "published",
            "published_at",
            "signing_key",
            "signature",
            "created_at",
        )
        read_only_fields = fields


class VersionWriteSerializer(serializers.Serializer[Any]):
    label = serializers.CharField(max_length=64, allow_blank=True)  # type: ignore[assignment]
    artifact_uri = serializers.CharField(max_length=500, allow_blank=True, trim_whitespace=False)
    digest = serializers.CharField(max_length=64, allow_blank=True)
    manifest = serializers.JSONField()
    runtime = serializers.ChoiceField(choices=ModelVersion.Runtime.choices)
    memory_gb = serializers.FloatField(required=False, default=1.0)
    tensor_parallel_size = serializers.IntegerField(required=False, default=1)
    capabilities = serializers.ListField(
        child=serializers.CharField(),
        required=False,
        help_text='What the build can do, for model aliases: "json_output", "tools", "vision".',
    )
    base_version: Any = serializers.PrimaryKeyRelatedField(
        queryset=ModelVersion.objects.select_related("model"),
        required=False,
        allow_null=True,
        help_text="A LoRA adapter: the id of the base version whose replicas load it.",
    )


class VersionPatchSerializer(VersionWriteSerializer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, partial=True, **kwargs)


def _versions() -> QuerySet[ModelVersion]:
    return ModelVersion.objects.select_related("model", "signing_key")


@extend_schema_view(get=extend_schema(operation_id="ops_versions_list", tags=["ops: registry"]))
class OpsVersionListApi(OperatorApi, generics.ListAPIView[ModelVersion]):
    serializer_class = VersionSerializer

    def get_queryset(self) -> QuerySet[ModelVersion]:
        model = _get(models_all(), pk=self.kwargs["pk"])
        return _versions().filter(model=model).order_by("-id")

    @extend_schema(
        operation_id="ops_versions_create",
        request=VersionWriteSerializer,
        responses={201: VersionSerializer},
        tags=["ops: registry"],
        description="Create a draft version; publish it to make it routable (and immutable).",
    )
    def post(self, request: Request, pk: int) -> Response:
        model = _get(models_all(), pk=pk)
        body = validated_body(VersionWriteSerializer, request)
        version = model_version_create(actor=actor_of(request), model=model, **body)
        return Response(VersionSerializer(version).data, status=status.HTTP_201_CREATED)


def _version_update(request: Request, version: ModelVersion, changes: dict[str, Any]) -> None:
    if version.is_published:
        raise Immutable(str(published_error(version).messages[0]))
    model_version_update(actor=actor_of(request), version=version, **changes)


class OpsVersionDetailApi(OperatorApi):
    serializer_class = VersionSerializer

    @extend_schema(operation_id="ops_versions_get", tags=["ops: registry"])
    def get(self, request: Request, pk: int) -> Response:
        return etag_read(VersionSerializer(_get(_versions(), pk=pk)).data)

    @extend_schema(
        operation_id="ops_versions_update",
        parameters=[IF_MATCH],
        request=VersionPatchSerializer,
        tags=["ops: registry"],
        description="Change a draft. A published version is immutable: 409 `immutable`.",
    )
    def patch(self, request: Request, pk: int) -> Response:
        body = validated_body(VersionPatchSerializer, request)
        return etag_update(
            request,
            fetch=lambda lock: _get(_versions(), lock, pk=pk),
            represent=lambda v: VersionSerializer(v).data,
            apply=lambda v: _version_update(request, v, dict(body)),
        )


class OpsVersionPublishApi(OperatorApi):
    serializer_class = VersionSerializer

    @extend_schema(operation_id="ops_versions_publish", request=None, tags=["ops: registry"])
    def post(self, request: Request, pk: int) -> Response:
        version = model_version_publish(actor=actor_of(request), version=_get(_versions(), pk=pk))
        return etag_read(VersionSerializer(version).data)


# --- pools -----------------------------------------------------------------------------------


class PoolSerializer(serializers.ModelSerializer[Pool]):
    class Meta:
        model = Pool
        fields = ("id", *POOL_FIELDS, "created_at")
        read_only_fields = fields


class PoolWriteSerializer(serializers.Serializer[Any]):
    name = serializers.CharField(max_length=63, allow_blank=True)
    hardware_tier = serializers.CharField(max_length=32, allow_blank=True)
    cost_per_replica_hour = serializers.DecimalField(max_digits=16, decimal_places=4)
    min_replicas = serializers.IntegerField(required=False, default=0)
    max_replicas = serializers.IntegerField(required=False, default=1)
    warm_replicas = serializers.IntegerField(required=False, default=0)
    policies = serializers.DictField(child=serializers.CharField(), required=False, default=dict)


class PoolPatchSerializer(PoolWriteSerializer):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, partial=True, **kwargs)


@extend_schema_view(get=extend_schema(operation_id="ops_pools_list", tags=["ops: registry"]))
class OpsPoolListApi(OperatorApi, generics.ListAPIView[Pool]):
    serializer_class = PoolSerializer

    def get_queryset(self) -> QuerySet[Pool]:
        return Pool.objects.order_by("-id")

    @extend_schema(
        operation_id="ops_pools_create",
        request=PoolWriteSerializer,
        responses={201: PoolSerializer},
        tags=["ops: registry"],
    )
    def post(self, request: Request) -> Response:
        body = validated_body(PoolWriteSerializer, request)
        pool = pool_create(actor=actor_of(request), **body)
        return Response(PoolSerializer(pool).data, status=status.HTTP_201_CREATED)


class OpsPoolDetailApi(OperatorApi):
    serializer_class = PoolSerializer

    @extend_schema(operation_id="ops_pools_get", tags=["ops: registry"])
    def get(self, request: Request, pk: int) -> Response:
        return etag_read(PoolSerializer(_get(Pool.objects.all(), pk=pk)).data)

    @extend_schema(
        operation_id="ops_pools_update",
        parameters=[IF_MATCH],
        request=PoolPatchSerializer,
        tags=["ops: registry"],
    )
    def patch(self, request: Request, pk: int) -> Response:
        body = validated_body(PoolPatchSerializer, request)
        return etag_update(
            request,
            fetch=lambda lock: _get(Pool.objects.all(), lock, pk=pk),
            represent=lambda p: PoolSerializer(p).data,
            apply=lambda p: pool_update(actor=actor_of(request), pool=p, **body),
        )


# --- endpoints -------------------------------------------------------------------------------


class EndpointSerializer(serializers.ModelSerializer[Endpoint]):
    class Meta:
        model = Endpoint
        fields = ("id", "pool", "version", "base_url", "state", "capacity", "created_at")
        read_only_fields = fields


class EndpointCreateSerializer(serializers.Serializer[Any]):
    pool = serializers.PrimaryKeyRelatedField(queryset=Pool.objects.all())
    version = serializers.PrimaryKeyRelatedField(queryset=ModelVersion.objects.all())
    base_url = serializers.CharField(max_length=300, allow_blank=True)
    capacity = serializers.IntegerField(required=False, default=8)


class EndpointStateSerializer(serializers.Serializer[Any]):
    state = serializers.ChoiceField(choices=Endpoint.State.choices)


def _endpoints() -> QuerySet[Endpoint]:
    return Endpoint.objects.select_related("pool", "version")


@extend_schema_view(get=extend_schema(operation_id="ops_endpoints_list", tags=["ops: registry"]))
class OpsEndpointListApi(OperatorApi, generics.ListAPIView[Endpoint]):
    serializer_class = EndpointSerializer

    def get_queryset(self) -> QuerySet[Endpoint]:
        endpoints = _endpoints().order_by("-id")
        state = self.request.query_params.get("state")
        return endpoints.filter(state=state) if state else endpoints

    @extend_schema(
        operation_id="ops_endpoints_register",
        request=EndpointCreateSerializer,
        responses={201: EndpointSerializer},
        tags=["ops: registry"],
    )
    def post(self, request: Request) -> Response:
        body = validated_body(EndpointCreateSerializer, request)
        endpoint = endpoint_register(actor=actor_of(request), **body)
        return Response(EndpointSerializer(endpoint).data, status=status.HTTP_201_CREATED)


class OpsEndpointDetailApi(OperatorApi):
    serializer_class = EndpointSerializer

    @extend_schema(operation_id="ops_endpoints_get", tags=["ops: registry"])
    def get(self, request: Request, pk: int) -> Response:
        return etag_read(EndpointSerializer(_get(_endpoints(), pk=pk)).data)

    @extend_schema(
        operation_id="ops_endpoints_set_state",
        parameters=[IF_MATCH],
        request=EndpointStateSerializer,
        tags=["ops: registry"],
    )
    def patch(self, request: Request, pk: int) -> Response:
        body = validated_body(EndpointStateSerializer, request)
        return etag_update(
            request,
            fetch=lambda lock: _get(_endpoints(), lock, pk=pk),
            represent=lambda e: EndpointSerializer(e).data,
            apply=lambda e: endpoint_set_state(
                actor=actor_of(request), endpoint=e, state=body["state"]
            ),
        )


# --- routes ----------------------------------------------------------------------------------


class SplitSerializer(serializers.Serializer[Any]):
    version = serializers.IntegerField(help_text="Id of a published version of the model.")
    weight = serializers.IntegerField()


class RouteSerializer(serializers.ModelSerializer[Route]):
    model = serializers.CharField(source="model.name", read_only=True)
    model_id = serializers.IntegerField(read_only=True)
    splits = serializers.SerializerMethodField()

    class Meta:
        model = Route
        fields = ("model_id", "model", "sticky_key", "splits", "updated_at")
        read_only_fields = fields

    @extend_schema_field(SplitSerializer(many=True))
    def get_splits(self, route: Route) -> list[dict[str, int]]:
        return [
            {"version": s.version_id, "weight": s.weight}
            for s in sorted(route.splits.all(), key=lambda s: s.version_id)
        ]


class RouteSetSerializer(serializers.Serializer[Any]):
    sticky_key = serializers.ChoiceField(
        choices=Route.StickyKey.choices, required=False, default=Route.StickyKey.TENANT
    )
    splits = SplitSerializer(many=True)


@extend_schema_view(get=extend_schema(operation_id="ops_routes_list", tags=["ops: registry"]))
class OpsRouteListApi(OperatorApi, generics.ListAPIView[Route]):
    serializer_class = RouteSerializer

    def get_queryset(self) -> QuerySet[Route]:
        return routes_all().order_by("-id")


class OpsRouteDetailApi(OperatorApi):
    serializer_class = RouteSerializer

    @extend_schema(operation_id="ops_routes_get", tags=["ops: registry"])
    def get(self, request: Request, pk: int) -> Response:
        route = _get(routes_all(), model_id=pk)
        return etag_read(RouteSerializer(route).data)

    @extend_schema(
        operation_id="ops_routes_set",
        request=RouteSetSerializer,
        tags=["ops: registry"],
        description="Replace how the model's traffic splits across its published versions. "
        "If-Match is checked when sent.",
    )
    def put(self, request: Request, pk: int) -> Response:
        model = _get(models_all(), pk=pk)
        body = validated_body(RouteSetSerializer, request)
        ids = [split["version"] for split in body["splits"]]
        versions = {v.pk: v for v in ModelVersion.objects.filter(pk__in=ids)}
        missing = sorted(set(ids) - set(versions))
        if missing:
            raise serializers.ValidationError(
                {"splits": [f"Unknown version id(s): {', '.join(map(str, missing))}."]}
            )
        splits = [(versions[s["version"]], s["weight"]) for s in body["splits"]]
        sticky_key = body["sticky_key"]
        if request.headers.get("If-Match") and routes_all().filter(model=model).exists():
            return etag_update(
                request,
                fetch=lambda lock: _get(routes_all(), lock, model_id=pk),
                represent=lambda r: RouteSerializer(r).data,
                apply=lambda _r: route_set(
                    actor=actor_of(request), model=model, splits=splits, sticky_key=sticky_key
                ),
            )
        route_set(actor=actor_of(request), model=model, splits=splits, sticky_key=sticky_key)
        return etag_read(RouteSerializer(_get(routes_all(), model_id=pk)).data)
