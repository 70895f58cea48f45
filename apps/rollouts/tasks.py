"""Celery tasks for rollouts: each fetches the rollout and calls one service, nothing else.

The front doors (admin actions, REST actions, the dashboard's buttons) queue these through
:func:`rollout_action_queue`, with the task the actions table (:mod:`apps.rollouts.actions`)
names, so they return at once; progress is the rollout's state and its events. Every task
takes keyword arguments only (``rollout_id``, ``actor_id``, and ``reason`` where the action
takes one).
"""

from __future__ import annotations

from typing import Any

from celery import current_app, shared_task
from celery.result import AsyncResult
from django.contrib.auth import get_user_model
from django.contrib.auth.base_user import AbstractBaseUser

from apps.rollouts import transitions
from apps.rollouts.actions import RolloutAction
from apps.rollouts.drain import rollout_drain_candidate
from apps.rollouts.evaluate import rollouts_evaluate_running
from apps.rollouts.models import Rollout
from apps.rollouts.warmup import rollout_warm_up

__all__ = [
    "rollout_action_queue",
    "rollout_advance",
    "rollout_drain_candidate",
    "rollout_pause",
    "rollout_promote",
    "rollout_resume",
    "rollout_rollback",
    "rollout_start",
    "rollouts_evaluate",
]


def _actor(actor_id: int | None) -> AbstractBaseUser | None:
    if actor_id is None:
        return None
    return get_user_model().objects.filter(pk=actor_id).first()


def _rollout(rollout_id: int) -> Rollout:
    return Rollout.objects.select_related("model", "stable_version", "candidate_version").get(
        pk=rollout_id
    )


def rollout_action_queue(
    action: RolloutAction, *, rollout_id: int, actor_id: int | None, reason: str = ""
) -> AsyncResult[Any]:
    """Queue ``action``'s task for the rollout (the reason only where the action takes one)."""
    if action.task is None:
        raise ValueError(f"rollout action {action.name!r} has no task; call its service")
    kwargs: dict[str, Any] = {"rollout_id": rollout_id, "actor_id": actor_id}
    if action.takes_reason:
        kwargs["reason"] = reason
    result: AsyncResult[Any] = current_app.tasks[action.task].apply_async(kwargs=kwargs)
    return result


@shared_task(name="apps.rollouts.tasks.rollout_start")
def rollout_start(*, rollout_id: int, actor_id: int | None = None) -> str:
    """Start, then warm up (the warm-up aborts the rollout with the reason when it fails)."""
    actor = _actor(actor_id)
    rollout = transitions.rollout_start(actor=actor, rollout=_rollout(rollout_id))
    return rollout_warm_up(actor=actor, rollout=rollout).state


@shared_task(name="apps.rollouts.tasks.rollout_advance")
def rollout_advance(*, rollout_id: int, actor_id: int | None = None, reason: str = "") -> str:
    rollout = _rollout(rollout_id)
    return transitions.rollout_advance(actor=_actor(actor_id), rollout=rollout, reason=reason).state


@shared_task(name="apps.rollouts.tasks.rollout_pause")
def rollout_pause(*, rollout_id: int, actor_id: int | None = None, reason: str = "") -> str:
    rollout = _rollout(rollout_id)
    return transitions.rollout_pause(actor=_actor(actor_id), rollout=rollout, reason=reason).state


@shared_task(name="apps.rollouts.tasks.rollout_resume")
def rollout_resume(*, rollout_id: int, actor_id: int | None = None) -> str:
    return transitions.rollout_resume(actor=_actor(actor_id), rollout=_rollout(rollout_id)).state


@shared_task(name="apps.rollouts.tasks.rollout_promote")
def rollout_promote(*, rollout_id: int, actor_id: int | None = None, reason: str = "") -> str:
    rollout = _rollout(rollout_id)
    return transitions.rollout_promote(actor=_actor(actor_id), rollout=rollout, reason=reason).state


@shared_task(name="apps.rollouts.tasks.rollout_rollback")
def rollout_rollback(*, rollout_id: int, actor_id: int | None = None, reason: str) -> str:
    rollout = _rollout(rollout_id)
    return transitions.rollout_rollback(
        actor=_actor(actor_id), rollout=rollout, reason=reason
    ).state


@shared_task(name="apps.rollouts.tasks.rollouts_evaluate")
def rollouts_evaluate() -> dict[int, str]:
    """Beat: evaluate every running rollout's gates (advance, promote or roll back)."""
    return rollouts_evaluate_running()
