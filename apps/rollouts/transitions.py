"""The rollout state machine: start, warm up, advance, pause, resume, promote, roll back.

::

    pending (draft) ─start→ warming ─warmed→ running(step 0) ─advance→ running(step k) …
         │                     └─abort (warm-up failed)→ aborted
         running ⇄ paused (pause / resume; the candidate keeps its current share while paused)
         running | paused ─promote→ promoted   (route: candidate 100 %)
         running | paused ─roll back→ rolled_back (route: stable 100 %, one snapshot publish)

The warm-up itself (artifact digest, a replica, warm-up requests) is ``apps.rollouts.warmup``;
after a rollback the replicas it started are drained by a task (``rollout_drain_candidate``).

Every transition locks the row, checks the state it starts from, writes a ``RolloutEvent``
(who, why, evidence) and an audit event, and changes the model's route in the same
transaction; the snapshot is published once on commit (``route_set``). Canary and A/B move
traffic through the route's weights; a shadow rollout keeps the route on stable and puts the
candidate in the snapshot's shadow fields (``apps.core.selectors``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.common.audit import audit_record
from apps.models.models import Route
from apps.models.services.routes import route_set
from apps.rollouts.actions import rollout_action
from apps.rollouts.drain import rollout_drain_candidate
from apps.rollouts.models import Rollout
from apps.rollouts.services import _event


def _transition(
    rollout: Rollout,
    *,
    actor: AbstractBaseUser | None,
    action: str,
    to_state: str | None = None,
    change: Callable[[Rollout], dict[str, Any] | None] | None = None,
    reason: str = "",
    data: dict[str, Any] | None = None,
    evidence: dict[str, Any] | None = None,
) -> Rollout:
    """Lock ``rollout``, check it is in one of ``action``'s from-states (the actions table,
    :mod:`apps.rollouts.actions`), move it to ``to_state``, apply ``change``, record it.

    ``change`` mutates the locked row further (step, route) and may return extra event data;
    the event's data also holds ``data`` and the gates' ``evidence`` when given. The row passed
    in is refreshed in place and returned.
    """
    allowed = rollout_action(action).states
    with transaction.atomic():
        locked = Rollout.objects.select_for_update().get(pk=rollout.pk)
        if locked.state not in allowed:
            raise ValidationError(
                f"Rollout #{locked.pk} is {locked.state}; {action} needs it to be "
                f"{' or '.join(allowed)}."
            )
        from_state = locked.state
        before = {"state": from_state, "current_step": locked.current_step}
        if to_state is not None:
            locked.state = to_state
        extra = (change(locked) if change is not None else None) or {}
        locked.save()
        _event(
            locked,
            actor=actor,
            kind=action,
            from_state=from_state,
            reason=reason,
            data={**({"evidence": evidence} if evidence else {}), **(data or {}), **extra},
        )
        audit_record(
            actor=actor,
            action=f"rollout.{action}",
            target=locked,
            before=before,
            after={"state": locked.state, "current_step": locked.current_step, "reason": reason},
        )
    rollout.refresh_from_db()
    return rollout


def candidate_share(rollout: Rollout) -> int:
    """The candidate's traffic percentage at the rollout's current step (0 for shadow)."""
    if rollout.mode == Rollout.Mode.SHADOW:
        return 0
    return int(rollout.steps[rollout.current_step])


def _route_to(rollout: Rollout, *, actor: AbstractBaseUser | None, share: int) -> dict[str, Any]:
    """Set the model's route so the candidate gets ``share`` percent (0..100)."""
    sticky = Route.objects.filter(model=rollout.model).values_list("sticky_key", flat=True).first()
    splits = []
    if share < 100:
        splits.append((rollout.stable_version, 100 - share))
    if share > 0:
        splits.append((rollout.candidate_version, share))
    route_set(
        actor=actor,
        model=rollout.model,
        splits=splits,
        sticky_key=sticky or Route.StickyKey.TENANT,
    )
    return {"candidate_share": share}


def _enter_step(rollout: Rollout, *, actor: AbstractBaseUser | None, step: int) -> dict[str, Any]:
    rollout.current_step = step
    rollout.step_started_at = timezone.now()
    if rollout.mode == Rollout.Mode.SHADOW:
        # All served traffic stays on stable; the shadow fields come from the rollout itself.
        return {**_route_to(rollout, actor=actor, share=0), "shadow_share": int(rollout.steps[0])}
    return _route_to(rollout, actor=actor, share=candidate_share(rollout))


def rollout_start(*, actor: AbstractBaseUser | None, rollout: Rollout) -> Rollout:
    """Draft → warming. The warm-up (:func:`apps.rollouts.warmup.rollout_warm_up`) then runs,
    in the same task."""
    return _transition(rollout, actor=actor, action="start", to_state=Rollout.State.WARMING)


def rollout_warmed(
    *, actor: AbstractBaseUser | None, rollout: Rollout, data: dict[str, Any] | None = None
) -> Rollout:
    """Warming → running at step 0 (the warm-up passed; ``data`` is what it checked)."""
    return _transition(
        rollout,
        actor=actor,
        action="warmed",
        to_state=Rollout.State.RUNNING,
        change=lambda locked: _enter_step(locked, actor=actor, step=0),
        data={"warmup": data} if data else None,
    )


def rollout_abort(
    *,
    actor: AbstractBaseUser | None,
    rollout: Rollout,
    reason: str,
    data: dict[str, Any] | None = None,
) -> Rollout:
    """Warming → aborted: the warm-up failed (``reason``); no traffic ever moved."""
    return _transition(
        rollout,
        actor=actor,
        action="abort",
        to_state=Rollout.State.ABORTED,
        reason=reason,
        data={"warmup": data} if data else None,
    )


def _check_step(rollout: Rollout, step: int | None) -> None:
    if step is not None and rollout.current_step != step:
        raise ValidationError(
            f"Rollout #{rollout.pk} already left step {step} (now {rollout.current_step})."
        )


def rollout_advance(
    *,
    actor: AbstractBaseUser | None,
    rollout: Rollout,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
    from_step: int | None = None,
) -> Rollout:
    """Running step k → step k+1; advancing past (or onto) a canary's 100 % step promotes.

    ``from_step``: advance only from that step (the evaluator's: a second evaluation of the
    same step, run concurrently or late, must not advance twice); ValidationError otherwise."""
    rollout.refresh_from_db()
    _check_step(rollout, from_step)
    last = len(rollout.steps) - 1
    if rollout.mode != Rollout.Mode.CANARY or rollout.current_step + 1 >= last:
        if rollout.mode == Rollout.Mode.CANARY:
            return rollout_promote(actor=actor, rollout=rollout, reason=reason, evidence=evidence)
        raise ValidationError(
            f"Rollout #{rollout.pk} is a {rollout.mode} rollout at its only step; promote or "
            "roll it back instead."
        )

    def change(locked: Rollout) -> dict[str, Any]:
        _check_step(locked, from_step)
        return _enter_step(locked, actor=actor, step=locked.current_step + 1)

    return _transition(
        rollout,
        actor=actor,
        action="advance",
        change=change,
        reason=reason,
        evidence=evidence,
    )


def rollout_pause(*, actor: AbstractBaseUser | None, rollout: Rollout, reason: str = "") -> Rollout:
    """Running → paused: the gates stop deciding; the candidate keeps its current share."""
    return _transition(
        rollout, actor=actor, action="pause", to_state=Rollout.State.PAUSED, reason=reason
    )


def rollout_resume(*, actor: AbstractBaseUser | None, rollout: Rollout) -> Rollout:
    """Paused → running; the step's clock restarts so its window holds only fresh traffic."""

    def restart_clock(locked: Rollout) -> None:
        locked.step_started_at = timezone.now()

    return _transition(
        rollout,
        actor=actor,
        action="resume",
        to_state=Rollout.State.RUNNING,
        change=restart_clock,
    )


def rollout_promote(
    *,
    actor: AbstractBaseUser | None,
    rollout: Rollout,
    reason: str = "",
    evidence: dict[str, Any] | None = None,
) -> Rollout:
    """Running or paused → promoted: all traffic to the candidate (one publish)."""

    def last_step(locked: Rollout) -> dict[str, Any]:
        locked.current_step = len(locked.steps) - 1
        locked.step_started_at = timezone.now()
        return _route_to(locked, actor=actor, share=100)

    return _transition(
        rollout,
        actor=actor,
        action="promote",
        to_state=Rollout.State.PROMOTED,
        change=last_step,
        reason=reason,
        evidence=evidence,
    )


def rollout_rollback(
    *,
    actor: AbstractBaseUser | None,
    rollout: Rollout,
    reason: str,
    evidence: dict[str, Any] | None = None,
) -> Rollout:
    """Warming, running or paused → rolled_back: all traffic to stable in one publish.

    The stable version's endpoints were never drained, so it takes the traffic back at once;
    after the commit, the candidate replicas the warm-up started are drained by a task.
    """
    reason = rollout_action("rollback").reason_check(reason)

    rolled_back = _transition(
        rollout,
        actor=actor,
        action="rollback",
        to_state=Rollout.State.ROLLED_BACK,
        change=lambda locked: _route_to(locked, actor=actor, share=0),
        reason=reason,
        evidence=evidence,
    )
    if rolled_back.warmup_endpoints:
        transaction.on_commit(lambda: rollout_drain_candidate.delay(rollout_id=rolled_back.pk))
    return rolled_back
