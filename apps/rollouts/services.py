"""Writes to rollouts: create one (canary, A/B or shadow) and cancel a draft.

The transitions that move traffic (start, advance, pause, resume, promote, roll back) live in
``apps.rollouts.transitions``; the gates' evaluation in ``apps.rollouts.evaluate``.
Every change writes a ``RolloutEvent`` (who and why) and an audit event.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from apps.common.audit import audit_record, audit_state
from apps.common.changes import audited_update
from apps.common.validation import float_error, is_int, raise_if
from apps.models.models import Model, ModelVersion
from apps.rollouts.actions import rollout_action
from apps.rollouts.models import ACTIVE_STATES, Rollout, RolloutEvent

DEFAULT_STEPS = (1, 5, 25, 50, 100)
# The gates and traffic rules an operator chooses when creating a rollout (admin form, REST).
ROLLOUT_RULE_FIELDS = (
    "max_error_rate_delta",
    "max_ttft_p95_ratio",
    "max_itl_p95_ratio",
    "max_cost_ratio",
    "step_window_s",
    "min_samples",
    "max_step_increase",
    "excluded_tenants",
    "sticky_header",
)
ROLLOUT_FIELDS = (
    "model_id",
    "stable_version_id",
    "candidate_version_id",
    "mode",
    "steps",
    "state",
    "current_step",
    *ROLLOUT_RULE_FIELDS,
)
# What a rollout event shows (admin, REST), oldest facts first.
EVENT_FIELDS = (
    "created_at",
    "kind",
    "from_state",
    "to_state",
    "step",
    "actor_label",
    "reason",
    "data",
)
SYSTEM_LABEL = "system"
# An HTTP header name (RFC 9110 token); these never assign a version (secrets, framing).
_HEADER_NAME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}")
REFUSED_STICKY_HEADERS = frozenset(
    {"authorization", "cookie", "content-length", "content-type", "host", "transfer-encoding"}
)


def actor_label(actor: AbstractBaseUser | None) -> str:
    return actor.get_username() if actor is not None else SYSTEM_LABEL


def rollout_active_message(active: Rollout) -> str:
    return (
        f"Model {active.model.name!r} already has an active rollout (#{active.pk}, "
        f"{active.state}: {active.stable_version.label} → {active.candidate_version.label}); "
        "finish or cancel it first."
    )


def _active_rollout(model: Model) -> Rollout | None:
    return (
        Rollout.objects.select_related("model", "stable_version", "candidate_version")
        .filter(model=model, state__in=ACTIVE_STATES)
        .first()
    )


def steps_error(mode: str, steps: object) -> str | None:
    """What is wrong with ``steps`` for ``mode`` (candidate traffic percentages), or None."""
    if not isinstance(steps, list | tuple) or not steps:
        return "Steps must be a non-empty list of integer percentages."
    if not all(is_int(step) and 1 <= step <= 100 for step in steps):
        return "Every step must be an integer percentage from 1 to 100."
    return _mode_steps_error(mode, list(steps))


def _mode_steps_error(mode: str, steps: list[int]) -> str | None:
    if mode == Rollout.Mode.CANARY:
        if any(later <= earlier for earlier, later in pairwise(steps)):
            return "Canary steps must be strictly increasing."
        return None if steps[-1] == 100 else "Canary steps must end at 100."
    if mode == Rollout.Mode.AB and (len(steps) != 1 or steps[0] >= 100):
        return "An A/B rollout has exactly one step: the candidate's share, below 100."
    if mode == Rollout.Mode.SHADOW and len(steps) != 1:
        return "A shadow rollout has exactly one step: the mirrored share, from 1 to 100."
    return None


def _blast_radius_error(mode: str, steps: object, max_step_increase: object) -> str | None:
    if not is_int(max_step_increase) or not 1 <= max_step_increase <= 100:  # type: ignore[operator]
        return "The largest step increase must be an integer percentage from 1 to 100."
    if mode != Rollout.Mode.CANARY or steps_error(mode, steps) is not None:
        return None
    shares = [0, *list(steps)[:-1]]  # type: ignore[call-overload]
    jumps = [later - earlier for earlier, later in pairwise(shares)]
    if any(jump > max_step_increase for jump in jumps):
        return (
            f"A step raises the candidate's share by more than {max_step_increase} points "
            "before the final promotion; add intermediate steps."
        )
    return None


def _tenants_error(excluded_tenants: object) -> str | None:
    if not isinstance(excluded_tenants, list | tuple) or not all(
        isinstance(slug, str) and slug for slug in excluded_tenants
    ):
        return "Excluded tenants must be a list of tenant slugs."
    return None


def sticky_header_error(sticky_header: object) -> str | None:
    """What is wrong with ``sticky_header`` (a header name, or "" for the route's key)."""
    if not isinstance(sticky_header, str):
        return "The sticky header must be a header name (or empty)."
    if sticky_header == "":
        return None
    if _HEADER_NAME.fullmatch(sticky_header) is None:
        return "The sticky header must be an HTTP header name (letters, digits, '-'; ≤ 64)."
    if sticky_header.lower() in REFUSED_STICKY_HEADERS:
        return f"{sticky_header!r} cannot assign versions; use a header such as X-Session-Id."
    return None


def _version_error(model: Model, version: ModelVersion | None, what: str) -> str | None:
    if version is None:
        return f"Choose the {what} version."
    if version.model_id != model.pk:
        return f"Version {version} is not a version of model {model.name!r}."
    if not ModelVersion.objects.filter(pk=version.pk, published_at__isnull=False).exists():
        return f"Version {version} is not published."
    return None


def rollout_validate(
    *,
    model: Model,
    stable_version: ModelVersion | None,
    candidate_version: ModelVersion | None,
    mode: str,
    steps: Sequence[int],
    max_error_rate_delta: float = 0.01,
    max_ttft_p95_ratio: float = 1.2,
    max_itl_p95_ratio: float = 1.2,
    max_cost_ratio: float = 1.1,
    step_window_s: int = 300,
    min_samples: int = 200,
    max_step_increase: int = 100,
    excluded_tenants: Sequence[str] = (),
    sticky_header: str = "",
) -> None:
    """Every rule of :func:`rollout_create`, the one-active-rollout-per-model rule included."""
    errors: dict[str, Any] = {
        "stable_version": _version_error(model, stable_version, "stable"),
        "candidate_version": _version_error(model, candidate_version, "candidate"),
        "mode": None
        if mode in Rollout.Mode.values
        else f"Mode must be one of {Rollout.Mode.values}.",
        "steps": steps_error(mode, steps),
        "max_error_rate_delta": float_error(max_error_rate_delta, minimum=0.0, strict=False)
        or (None if max_error_rate_delta <= 1 else "Must be at most 1 (an error-rate fraction)."),
        "max_ttft_p95_ratio": float_error(max_ttft_p95_ratio, minimum=0.0, strict=True),
        "max_itl_p95_ratio": float_error(max_itl_p95_ratio, minimum=0.0, strict=True),
        "max_cost_ratio": float_error(max_cost_ratio, minimum=0.0, strict=True),
        "step_window_s": None
        if is_int(step_window_s) and 1 <= step_window_s <= 86_400
        else "Step window must be a whole number of seconds from 1 to 86400.",
        "min_samples": None
        if is_int(min_samples) and min_samples >= 1
        else "Minimum samples must be a positive whole number.",
        "max_step_increase": _blast_radius_error(mode, steps, max_step_increase),
        "excluded_tenants": _tenants_error(excluded_tenants),
        "sticky_header": sticky_header_error(sticky_header),
    }
    if (
        stable_version is not None
        and candidate_version is not None
        and stable_version.pk == candidate_version.pk
    ):
        errors["candidate_version"] = "The candidate must differ from the stable version."
    active = _active_rollout(model)
    errors["model"] = rollout_active_message(active) if active is not None else None
    raise_if(errors)


def _event(
    rollout: Rollout,
    *,
    actor: AbstractBaseUser | None,
    kind: str,
    from_state: str = "",
    reason: str = "",
    data: dict[str, Any] | None = None,
) -> RolloutEvent:
    return RolloutEvent.objects.create(
        rollout=rollout,
        kind=kind,
        from_state=from_state,
        to_state=rollout.state,
        step=rollout.current_step,
        actor_label=actor_label(actor),
        reason=reason,
        data=data or {},
    )


def rollout_create(
    *,
    actor: AbstractBaseUser | None,
    model: Model,
    stable_version: ModelVersion,
    candidate_version: ModelVersion,
    mode: str,
    steps: Sequence[int] = DEFAULT_STEPS,
    max_error_rate_delta: float = 0.01,
    max_ttft_p95_ratio: float = 1.2,
    max_itl_p95_ratio: float = 1.2,
    max_cost_ratio: float = 1.1,
    step_window_s: int = 300,
    min_samples: int = 200,
    max_step_increase: int = 100,
    excluded_tenants: Sequence[str] = (),
    sticky_header: str = "",
) -> Rollout:
    """Plan a rollout of ``candidate_version`` against ``stable_version`` (state ``pending``,
    shown as *Draft*; :func:`apps.rollouts.transitions.rollout_start` starts it).

    ``steps`` are the candidate's traffic percentages: canary, strictly increasing to 100;
    A/B, one share below 100; shadow, one mirrored share. At most one active rollout per model.
    ``max_step_increase`` bounds each canary step's jump (the blast radius); tenants in
    ``excluded_tenants`` always get the stable version; ``min_samples`` is the gates' minimum.
    ``sticky_header`` (a header name, stored lower-case) makes the router assign versions by
    that header's value while the rollout holds traffic.
    """
    config: dict[str, Any] = {
        "mode": mode,
        "max_error_rate_delta": max_error_rate_delta,
        "max_ttft_p95_ratio": max_ttft_p95_ratio,
        "max_itl_p95_ratio": max_itl_p95_ratio,
        "max_cost_ratio": max_cost_ratio,
        "step_window_s": step_window_s,
        "min_samples": min_samples,
        "max_step_increase": max_step_increase,
        "excluded_tenants": list(excluded_tenants),
        "sticky_header": sticky_header,
    }
    rollout_validate(
        model=model,
        stable_version=stable_version,
        candidate_version=candidate_version,
        steps=steps,
        **config,
    )
    config["sticky_header"] = sticky_header.lower()
    with transaction.atomic():
        try:
            with transaction.atomic():
                rollout = Rollout.objects.create(
                    model=model,
                    stable_version=stable_version,
                    candidate_version=candidate_version,
                    steps=list(steps),
                    created_by_id=actor.pk if actor is not None else None,
                    **config,
                )
        except IntegrityError as exc:
            # Two creates raced past the check: the partial unique index decided.
            active = _active_rollout(model)
            if active is None:
                raise
            raise ValidationError({"model": rollout_active_message(active)}) from exc
        _event(rollout, actor=actor, kind="created", data={**config, "steps": list(steps)})
        audit_record(
            actor=actor,
            action="rollout.create",
            target=rollout,
            after=audit_state(rollout, ROLLOUT_FIELDS),
        )
    return rollout


def rollout_cancel(*, actor: AbstractBaseUser | None, rollout: Rollout, reason: str) -> Rollout:
    """Stop a rollout that has moved no traffic (draft or warming) for good (``cancelled``).

    A running or paused rollout is rolled back instead (``rollout_rollback``), which also moves
    its traffic back to stable. ``rollout`` is refreshed in place."""
    cancel = rollout_action("cancel")
    reason = cancel.reason_check(reason)
    with transaction.atomic():
        locked = Rollout.objects.select_for_update().get(pk=rollout.pk)
        if not cancel.enabled_in(locked.state):
            raise ValidationError(
                f"Rollout #{locked.pk} is {locked.state}; only a draft or warming rollout can "
                "be cancelled (roll back a running or paused one)."
            )
        before = locked.state
        audited_update(
            actor=actor,
            action="rollout.cancel",
            target=locked,
            changes={"state": Rollout.State.CANCELLED},
            note={"reason": reason},
            publish=False,
        )
        _event(locked, actor=actor, kind="cancelled", from_state=before, reason=reason)
    rollout.refresh_from_db()
    return rollout
