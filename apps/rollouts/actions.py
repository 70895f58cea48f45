"""The rollout actions table: every transition an operator (or the warm-up) can ask for.

One row per action: its name (the URL segment, the admin action ``<name>_selected``, the
dashboard button, the event kind and ``rollout.<name>`` in the audit log), its label, the
states it may start from, the Celery task that runs it (None: it runs in the request), and
its reason rules. Everything that offers or runs an action reads this table: the services
(:mod:`apps.rollouts.transitions`, :func:`apps.rollouts.services.rollout_cancel`) check the
from-states under the row lock, the admin actions, the REST actions
(:mod:`apps.rollouts.api_actions`, their OpenAPI text included) and the dashboard's buttons
(:mod:`frontend.rollout_actions`) enable and describe themselves from it.

Every task takes keyword arguments only: ``rollout_id``, ``actor_id`` and, when
``takes_reason``, ``reason``.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import ValidationError

_TASKS = "apps.rollouts.tasks"


@dataclass(frozen=True, slots=True)
class RolloutAction:
    name: str
    label: str
    states: tuple[str, ...]  # the rollout states it may start from
    task: str | None  # the Celery task's name; None: the service runs in the request
    result: str  # what the action leads to (after the arrow in its description)
    done: str  # past participle, for messages: "Rollout #3: rolled back requested."
    takes_reason: bool = False  # the service records a reason
    reason_missing: str = ""  # set when a reason is required: the error for a blank one
    operator: bool = True  # offered to operators (False: only the warm-up runs it)

    @property
    def needs_reason(self) -> bool:
        return bool(self.reason_missing)

    def enabled_in(self, state: str) -> bool:
        return state in self.states

    def reason_check(self, reason: object) -> str:
        """The reason stripped; a blank one is refused when this action needs a reason."""
        text = reason.strip() if isinstance(reason, str) else ""
        if self.reason_missing and not text:
            raise ValidationError({"reason": self.reason_missing})
        return text

    def description(self) -> str:
        """``Running or paused → promoted (candidate 100 %).``"""
        names = [state.replace("_", " ") for state in self.states]
        sources = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        return f"{sources.capitalize()} → {self.result}"


ROLLOUT_ACTIONS: tuple[RolloutAction, ...] = (
    RolloutAction(
        "start", "Start", ("pending",), f"{_TASKS}.rollout_start",
        "warming, then the warmup: running at step 0, or aborted.", "started",
    ),
    RolloutAction(
        "warmed", "Warmed", ("warming",), None, "running at step 0.", "warmed", operator=False,
    ),
    RolloutAction(
        "abort", "Abort", ("warming",), None, "aborted (the warm-up failed).", "aborted",
        takes_reason=True, operator=False,
    ),
    RolloutAction(
        "advance", "Advance", ("running",), f"{_TASKS}.rollout_advance",
        "the next step (a canary's last promotes).", "advanced", takes_reason=True,
    ),
    RolloutAction(
        "pause", "Pause", ("running",), f"{_TASKS}.rollout_pause",
        "paused; the candidate keeps its share.", "paused", takes_reason=True,
    ),
    RolloutAction(
        "resume", "Resume", ("paused",), f"{_TASKS}.rollout_resume",
        "running; the step's window restarts.", "resumed",
    ),
    RolloutAction(
        "promote", "Promote", ("running", "paused"), f"{_TASKS}.rollout_promote",
        "promoted (candidate 100 %).", "promoted", takes_reason=True,
    ),
    RolloutAction(
        "rollback", "Roll back", ("warming", "running", "paused"), f"{_TASKS}.rollout_rollback",
        "rolled back (stable 100 %).", "rolled back", takes_reason=True,
        reason_missing="Say why the rollout is rolled back.",
    ),
    RolloutAction(
        "cancel", "Cancel", ("pending", "warming"), None,
        "cancelled (a draft or warming rollout, no traffic moved).", "cancelled",
        takes_reason=True, reason_missing="Say why the rollout is cancelled.",
    ),
)  # fmt: skip


def rollout_action(name: str) -> RolloutAction:
    """The row named ``name`` (KeyError for an unknown name)."""
    for action in ROLLOUT_ACTIONS:
        if action.name == name:
            return action
    raise KeyError(name)


def operator_actions() -> dict[str, RolloutAction]:
    """The actions offered at the front doors (admin, REST, dashboard), by name, in order."""
    return {action.name: action for action in ROLLOUT_ACTIONS if action.operator}
