"""Celery tasks for rollouts: each fetches the rollout and calls one service, nothing else.

The admin's buttons (and later REST and the dashboard) enqueue these, so they return at once;
progress is the rollout's state and its events.
"""

from __future__ import annotations

from celery import shared_task
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser

from apps.rollouts import transitions
from apps.rollouts.evaluate import rollouts_evaluate_running
from apps.rollouts.models import Rollout
from apps.rollouts.warmup import candidate_drain, rollout_warm_up


def _actor(actor_id: int | None) -> AbstractBaseUser | None:
    if actor_id is None:
        return None
    return get_user_model().objects.filter(pk=actor_id).first()


def _rollout(rollout_id: int) -> Rollout:
    return Rollout.objects.select_related("model", "stable_version", "candidate_version").get(
        pk=rollout_id
    )


@shared_task(name="apps.rollouts.tasks.rollout_start")
def rollout_start(rollout_id: int, actor_id: int | None = None) -> str:
    """Start, then warm up (the warm-up aborts the rollout with the reason when it fails)."""
    actor = _actor(actor_id)
    rollout = transitions.rollout_start(actor=actor, rollout=_rollout(rollout_id))
    return rollout_warm_up(actor=actor, rollout=rollout).state


@shared_task(name="apps.rollouts.tasks.rollout_drain_candidate")
def rollout_drain_candidate(rollout_id: int) -> list[int]:
    """After a rollback: drain and stop the candidate replicas the warm-up started."""
    return candidate_drain(rollout=_rollout(rollout_id))


@shared_task(name="apps.rollouts.tasks.rollout_advance")
def rollout_advance(rollout_id: int, actor_id: int | None = None, reason: str = "") -> str:
    rollout = _rollout(rollout_id)
    return transitions.rollout_advance(actor=_actor(actor_id), rollout=rollout, reason=reason).state


@shared_task(name="apps.rollouts.tasks.rollout_pause")
def rollout_pause(rollout_id: int, actor_id: int | None = None, reason: str = "") -> str:
    rollout = _rollout(rollout_id)
    return transitions.rollout_pause(actor=_actor(actor_id), rollout=rollout, reason=reason).state


@shared_task(name="apps.rollouts.tasks.rollout_resume")
def rollout_resume(rollout_id: int, actor_id: int | None = None) -> str:
    return transitions.rollout_resume(actor=_actor(actor_id), rollout=_rollout(rollout_id)).state


@shared_task(name="apps.rollouts.tasks.rollout_promote")
def rollout_promote(rollout_id: int, actor_id: int | None = None, reason: str = "") -> str:
    rollout = _rollout(rollout_id)
    return transitions.rollout_promote(actor=_actor(actor_id), rollout=rollout, reason=reason).state


@shared_task(name="apps.rollouts.tasks.rollout_rollback")
def rollout_rollback(rollout_id: int, reason: str, actor_id: int | None = None) -> str:
    rollout = _rollout(rollout_id)
    return transitions.rollout_rollback(
        actor=_actor(actor_id), rollout=rollout, reason=reason
    ).state


@shared_task(name="apps.rollouts.tasks.rollouts_evaluate")
def rollouts_evaluate() -> dict[int, str]:
    """Beat: evaluate every running rollout's gates (advance, promote or roll back)."""
    return rollouts_evaluate_running()
