"""Reads of the autoscaling records."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.models.models import Pool
from apps.scaling.models import ReplicaStart, ScalingDecision


def decisions_for_pool(*, pool: Pool, limit: int = 50) -> QuerySet[ScalingDecision]:
    return ScalingDecision.objects.filter(pool=pool)[:limit]


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
