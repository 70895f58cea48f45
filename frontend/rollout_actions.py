"""The rollout buttons: which actions the dashboard offers and the service each one calls.

Each action is a name, a label and the service that performs it (``None``: planned, shown
disabled): the same services (apps/rollouts/transitions.py) that the admin's buttons, the REST
API and the Celery tasks call. The dashboard calls them in the request, so the page says at once
what happened (or why it was refused); the rollout's events tell the rest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from django.contrib.auth.base_user import AbstractBaseUser

from apps.rollouts import transitions
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


def _start(actor: AbstractBaseUser, rollout: Rollout, reason: str) -> object:
    """Start, then warm up (a failed warmup aborts the rollout with the reason)."""
    started = transitions.rollout_start(actor=actor, rollout=rollout)
    return transitions.rollout_warmup(actor=actor, rollout=started)


def _advance(actor: AbstractBaseUser, rollout: Rollout, reason: str) -> object:
    return transitions.rollout_advance(actor=actor, rollout=rollout, reason=reason)


def _pause(actor: AbstractBaseUser, rollout: Rollout, reason: str) -> object:
    return transitions.rollout_pause(actor=actor, rollout=rollout, reason=reason)


def _resume(actor: AbstractBaseUser, rollout: Rollout, reason: str) -> object:
    return transitions.rollout_resume(actor=actor, rollout=rollout)


def _promote(actor: AbstractBaseUser, rollout: Rollout, reason: str) -> object:
    return transitions.rollout_promote(actor=actor, rollout=rollout, reason=reason)


def _rollback(actor: AbstractBaseUser, rollout: Rollout, reason: str) -> object:
    return transitions.rollout_rollback(actor=actor, rollout=rollout, reason=reason)


def rollout_actions() -> dict[str, RolloutAction]:
    actions = [
        RolloutAction("start", "Start", _start),
        RolloutAction("advance", "Advance", _advance),
        RolloutAction("pause", "Pause", _pause),
        RolloutAction("resume", "Resume", _resume),
        RolloutAction("promote", "Promote", _promote),
        RolloutAction("rollback", "Roll back", _rollback, needs_reason=True),
        RolloutAction("cancel", "Cancel", _cancel, needs_reason=True),
    ]
    return {action.name: action for action in actions}
