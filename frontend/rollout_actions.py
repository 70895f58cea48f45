"""The rollout buttons: the dashboard's view of the actions table and how a press runs.

Which actions exist, their labels, the states that enable them and their reason rules are the
rollouts app's actions table (:mod:`apps.rollouts.actions`), which the services, the admin and
the REST API read too. Start, advance, pause, resume, promote and roll back queue the table's
Celery task (:func:`apps.rollouts.tasks.rollout_action_queue`). The page answers at once
("queued") and the staff feed (:mod:`frontend.control_feed`) shows the task's progress and the
rollout's new state live; a refusal shows the service's message. Cancel has no task: it calls
its service in the request. ``states`` only enables the buttons; whether a transition is
allowed is the service's call, under the row lock.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.base_user import AbstractBaseUser

from apps.rollouts.actions import RolloutAction, operator_actions
from apps.rollouts.models import Rollout
from apps.rollouts.services import rollout_cancel
from apps.rollouts.tasks import rollout_action_queue
from frontend.control_feed import task_error, task_note
from frontend.relay import live_namespace
from runtime.redis_conn import sync_client


@dataclass(frozen=True, slots=True)
class Outcome:
    level: str  # "success" | "error" | "info"
    text: str


def rollout_actions() -> dict[str, RolloutAction]:
    """The buttons, in the table's order."""
    return operator_actions()


def action_perform(
    action: RolloutAction, *, actor: AbstractBaseUser, rollout: Rollout, reason: str
) -> Rollout:
    """Run an action without a task (cancel) in the request; ValidationError when refused."""
    if action.name != "cancel":
        raise ValueError(f"rollout action {action.name!r} runs as a task; queue it")
    return rollout_cancel(actor=actor, rollout=rollout, reason=reason)


def action_queue(
    action: RolloutAction, *, actor: AbstractBaseUser, rollout: Rollout, reason: str
) -> Outcome:
    """Queue ``action``'s task and note it for the staff feed. An eager Celery (tests) has
    already run it: then the outcome is final."""
    result = rollout_action_queue(action, rollout_id=rollout.pk, actor_id=actor.pk, reason=reason)
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
