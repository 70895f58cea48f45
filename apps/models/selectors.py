"""Reads of the model registry."""

from __future__ import annotations

from collections.abc import Mapping

from django.db.models import Prefetch, QuerySet

from apps.models.models import Endpoint, Model, ModelVersion, Pool, Route, TrustedKey
from runtime.workers.adapters import LoraSettings


def models_all() -> QuerySet[Model]:
    return Model.objects.all()


def model_get_by_name(name: str) -> Model | None:
    return Model.objects.filter(name=name).first()


def model_versions_published(model: Model | None = None) -> QuerySet[ModelVersion]:
    """Published versions (of ``model`` when given), oldest first."""
    versions = ModelVersion.objects.select_related("model").filter(published_at__isnull=False)
    if model is not None:
        versions = versions.filter(model=model)
    return versions.order_by("model__name", "published_at", "pk")


def endpoints_live() -> QuerySet[Endpoint]:
    """Endpoints that are not gone (starting, ready or draining)."""
    return (
        Endpoint.objects.select_related("pool", "version__model")
        .exclude(state=Endpoint.State.GONE)
        .order_by("pool__name", "pk")
    )


def pools_with_endpoints() -> QuerySet[Pool]:
    """Every pool with its live endpoints prefetched as ``live_endpoints``."""
    return Pool.objects.prefetch_related(
        Prefetch("endpoints", queryset=endpoints_live(), to_attr="live_endpoints")
    ).order_by("name")


def route_for(model: Model) -> Route | None:
    """The model's route with its splits (and their versions) prefetched, or None."""
    return (
        Route.objects.select_related("model")
        .prefetch_related("splits__version")
        .filter(model=model)
        .first()
    )


def routes_all() -> QuerySet[Route]:
    return Route.objects.select_related("model").prefetch_related("splits__version")


def trusted_keys_active() -> dict[str, str]:
    """The active trusted keys' public keys by name: what a worker checks signatures with."""
    return dict(TrustedKey.objects.filter(active=True).values_list("name", "public_key"))


def lora_settings(version: ModelVersion, policies: Mapping[str, str]) -> tuple[int, int, int]:
    """``(max_loras, max_cpu_loras, max_lora_rank)`` for a replica of ``version`` in a pool
    with ``policies``: ``(0, 0, 8)`` (LoRA off) without published adapters; else the pool's
    slots (:class:`runtime.workers.adapters.LoraSettings`, what the routers assume too) and
    the largest adapter rank (at least 8, vLLM's smallest supported maximum)."""
    manifests = version.adapters.filter(published_at__isnull=False).values_list(
        "manifest", flat=True
    )
    ranks = [m.get("lora_rank") for m in manifests if isinstance(m, dict)]
    if not manifests.exists():
        return 0, 0, 8
    rank = max([8, *(r for r in ranks if isinstance(r, int) and not isinstance(r, bool))])
    slots = LoraSettings.from_policies(policies)
    return slots.max_loras, slots.max_cpu_loras, rank
