"""The rollout buttons: which actions the dashboard offers, in which states, and how they run.

Start, advance, pause, resume, promote and roll back queue the action's Celery task
(``apps.rollouts.tasks``, the same tasks the REST API queues; each calls one service of
``apps.rollouts.transitions``). The page answers at once ("queued") and the staff feed
(:mod:`frontend.control_feed`) shows the task's progress and the rollout's new state live;
a refusal shows the service's message. Cancel has no task: it calls its service in the
request. ``states`` only enables the buttons; whether a transition is allowed is the
service's call, under the row lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser

from apps.rollouts import tasks
from apps.rollouts.models import Rollout
from apps.rollouts.services import rollout_cancel
from frontend.control_feed import task_error, task_note
from frontend.relay import live_namespace
from runtime.redis_conn import sync_client

Perform = Callable[[AbstractBaseUser, Rollout, str], object]


@dataclass(frozen=True, slots=True)
class RolloutAction:
    name: str
    label: str
    states: tuple[str, ...]  # the rollout states in which the button is enabled
    task: Any = None  # a Celery task taking rollout_id, actor_id (and reason when takes_reason)
    takes_reason: bool = False
    perform: Perform | None = None  # run in the request (no task)
    needs_reason: bool = False

    def enabled_in(self, state: str) -> bool:
        return state in self.states


@dataclass(frozen=True, slots=True)
class Outcome:
    level: str  # "success" | "error" | "info"
    text: str


def _cancel(actor: AbstractBaseUser, rollout: Rollout, reason: str) -> object:
    return rollout_cancel(actor=actor, rollout=rollout, reason=reason)


def rollout_actions() -> dict[str, RolloutAction]:
    actions = [
        RolloutAction("start", "Start", ("pending",), tasks.rollout_start),
        RolloutAction("advance", "Advance", ("running",), tasks.rollout_advance, True),
        RolloutAction("pause", "Pause", ("running",), tasks.rollout_pause, True),
        RolloutAction("resume", "Resume", ("paused",), tasks.rollout_resume),
        RolloutAction("promote", "Promote", ("running", "paused"), tasks.rollout_promote, True),
        RolloutAction(
            "rollback",
            "Roll back",
            ("warming", "running", "paused"),
            tasks.rollout_rollback,
            True,
            needs_reason=True,
        ),
        RolloutAction(
            "cancel", "Cancel", ("pending", "warming"), perform=_cancel, needs_reason=True
        ),
    ]
    return {action.name: action for action in actions}


def action_queue(
    action: RolloutAction, *, actor: AbstractBaseUser, rollout: Rollout, reason: str
) -> Outcome:
    """Queue ``action``'s task and note it for the staff feed. An eager Celery (tests) has
    already run it: then the outcome is final."""
    kwargs: dict[str, Any] = {"rollout_id": rollout.pk, "actor_id": actor.pk}
    if action.takes_reason:
        kwargs["reason"] = reason
    result = action.task.apply_async(kwargs=kwargs)
    client = sync_client(
        settings.REDIS_URL, name="dashboard-actions", timeout_s=2.0, connect_timeout_s=1.0
    )
    try:
        task_note(
            client,
            live_namespace(),
            task_id=result.id,
            rollout=rollout.pk,
            action=action.name,
            label=action.label,
        )
    finally:
        client.close()
    prefix = f"Rollout #{rollout.pk}: {action.label.lower()}"
    if not result.ready():
        return Outcome("info", f"{prefix} queued (task {result.id[:8]}); its progress shows here.")
    if result.failed():
        return Outcome("error", task_error(result.result))
    return Outcome("success", f"{prefix} done.")
