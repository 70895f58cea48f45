"""Reads of rollouts and their events."""

from __future__ import annotations

from django.db.models import QuerySet

from apps.models.models import Model
from apps.rollouts.models import ACTIVE_STATES, Rollout, RolloutEvent


def rollouts_active() -> QuerySet[Rollout]:
    """Pending, running and paused rollouts (at most one per model)."""
    return Rollout.objects.select_related("model", "stable_version", "candidate_version").filter(
        state__in=ACTIVE_STATES
    )


def rollout_active_for(model: Model) -> Rollout | None:
    return rollouts_active().filter(model=model).first()


def rollout_events(rollout: Rollout) -> QuerySet[RolloutEvent]:
    """The rollout's events, oldest first."""
    return RolloutEvent.objects.filter(rollout=rollout).order_by("created_at", "pk")
