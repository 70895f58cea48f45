"""The rollout buttons: which actions the dashboard offers and the service each one calls.

Each action is a name, a label and the service that performs it (``None``: planned, shown
disabled). The rollouts issue (#15) adds start/advance/pause/promote/roll back as services
(and Celery tasks); wiring one here is one entry.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.auth.base_user import AbstractBaseUser

from apps.rollouts.models import Rollout
from apps.rollouts.services import rollout_cancel

Perform = Callable[[AbstractBaseUser, Rollout, str], object]


@dataclass(frozen=True, slots=True)
class RolloutAction:
    name: str
    label: str
    perform: Perform | None  # None: not available yet (planned)
    needs_reason: bool = False

    @property
    def available(self) -> bool:  # templates call callables, so they test this, not perform
        return self.perform is not None


def _cancel(actor: AbstractBaseUser, rollout: Rollout, reason: str) -> object:
    return rollout_cancel(actor=actor, rollout=rollout, reason=reason)


def rollout_actions() -> dict[str, RolloutAction]:
    actions = [
        RolloutAction("start", "Start", None),
        RolloutAction("advance", "Advance", None),
        RolloutAction("pause", "Pause", None),
        RolloutAction("promote", "Promote", None),
        RolloutAction("rollback", "Roll back", None, needs_reason=True),
        RolloutAction("cancel", "Cancel", _cancel, needs_reason=True),
    ]
    return {action.name: action for action in actions}
