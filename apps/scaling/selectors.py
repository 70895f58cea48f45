"""Reads of the autoscaling records."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.models.models import Pool
from apps.scaling.models import ReplicaStart, ScalingDecision


def decisions_for_pool(*, pool: Pool, limit: int = 50) -> QuerySet[ScalingDecision]:
    return ScalingDecision.objects.filter(pool=pool)[:limit]


def pool_decisions(*, pool: Pool) -> QuerySet[ScalingDecision]:
    """Every decision for ``pool``, unsliced (the REST API pages it by cursor, newest first)."""
    return ScalingDecision.objects.filter(pool=pool)


def expected_start_s(*, version_id: int, warm: bool = False, default: float = 60.0) -> float:
    """The measured start time of a version's replicas: the slowest of its last five starts
    (cold unless ``warm``); ``default`` when none was measured."""
    times = list(
        ReplicaStart.objects.filter(version_id=version_id, warm=warm).values_list(
            "seconds", flat=True
        )[:5]
    )
    return max(times) if times else default


def autoscaled_pools() -> QuerySet[Pool]:
    """The pools the controller looks at: every pool without scaling turned off."""
    return Pool.objects.exclude(scaling__enabled=False).select_related("scaling")


def scale_from_zero_versions() -> dict[int, tuple[str, float]]:
    """Version id -> (pool, expected start seconds) for the versions a pool can start from zero:
    an autoscaled pool with ``min_replicas = 0`` whose actuator has started the version before
    (the start time is measured, not guessed: the slowest of its last five cold starts).
    One query, whatever the number of versions (the snapshot build counts its queries)."""
    rows = (
        ReplicaStart.objects.filter(warm=False, pool__min_replicas=0, pool__max_replicas__gt=0)
        .exclude(pool__scaling__enabled=False)
        .order_by("-created_at", "-id")
        .values_list("version_id", "pool__name", "seconds")
    )
    recent: dict[int, tuple[str, list[float]]] = {}
    for version_id, pool, seconds in rows:
        _, times = recent.setdefault(version_id, (pool, []))
        if len(times) < 5:
            times.append(seconds)
    return {v: (pool, max(times)) for v, (pool, times) in recent.items()}
