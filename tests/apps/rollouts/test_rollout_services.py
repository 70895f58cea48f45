"""rollout_create / rollout_cancel."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.db import IntegrityError

from apps.common.models import AuditEvent
from apps.models.services import model_create
from apps.rollouts.models import Rollout, RolloutEvent
from apps.rollouts.selectors import rollout_active_for, rollout_events
from apps.rollouts.services import rollout_cancel, rollout_create

pytestmark = [pytest.mark.db, pytest.mark.django_db]


def errors_of(excinfo: pytest.ExceptionInfo[ValidationError]) -> dict[str, list[str]]:
    return excinfo.value.message_dict


@pytest.fixture
def create(llm, stable, candidate):
    def make(**overrides):
        values = {
            "actor": None,
            "model": llm,
            "stable_version": stable,
            "candidate_version": candidate,
            "mode": "canary",
            **overrides,
        }
        return rollout_create(**values)

    return make


def test_create_canary_with_defaults(create, admin_user, llm):
    rollout = create(actor=admin_user)

    rollout.refresh_from_db()
    assert rollout.state == Rollout.State.PENDING
    assert rollout.steps == [1, 5, 25, 50, 100]
    assert rollout.created_by == admin_user
    assert (rollout.max_error_rate_delta, rollout.max_ttft_p95_ratio) == (0.01, 1.2)
    assert (rollout.max_cost_ratio, rollout.step_window_s) == (1.1, 300)
    [event] = rollout_events(rollout)
    assert (event.kind, event.to_state, event.actor_label) == (
        "created",
        "pending",
        admin_user.username,
    )
    assert event.data["steps"] == [1, 5, 25, 50, 100]
    audit = AuditEvent.objects.get(action="rollout.create")
    assert audit.after["mode"] == "canary"
    assert rollout_active_for(llm) == rollout


@pytest.mark.parametrize(
    ("mode", "steps"),
    [
        ("canary", [10, 100]),
        ("canary", [100]),
        ("canary", (1, 2, 3, 100)),
        ("ab", [50]),
        ("ab", [1]),
        ("ab", [99]),
        ("shadow", [1]),
        ("shadow", [100]),
    ],
)
def test_create_accepts_valid_steps(create, mode, steps):
    rollout = create(mode=mode, steps=steps)
    assert rollout.steps == list(steps)
    assert rollout.mode == mode


@pytest.mark.parametrize(
    ("mode", "steps", "message"),
    [
        ("canary", [], "non-empty list"),
        ("canary", "1,5,100", "non-empty list"),
        ("canary", [1, 5, 5, 100], "strictly increasing"),
        ("canary", [5, 1, 100], "strictly increasing"),
        ("canary", [1, 5, 50], "must end at 100"),
        ("canary", [0, 100], "from 1 to 100"),
        ("canary", [1, 101], "from 1 to 100"),
        ("canary", [1.5, 100], "from 1 to 100"),
        ("canary", [True, 100], "from 1 to 100"),
        ("ab", [100], "below 100"),
        ("ab", [10, 20], "exactly one step"),
        ("shadow", [0], "from 1 to 100"),
        ("shadow", [5, 10], "exactly one step"),
    ],
)
def test_create_refuses_bad_steps(create, mode, steps, message):
    with pytest.raises(ValidationError) as excinfo:
        create(mode=mode, steps=steps)
    assert message in errors_of(excinfo)["steps"][0]
    assert not Rollout.objects.exists()


def test_create_ab_needs_explicit_steps(create):
    with pytest.raises(ValidationError, match="exactly one step"):
        create(mode="ab")


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"mode": "blue-green"}, "mode"),
        ({"max_error_rate_delta": -0.1}, "max_error_rate_delta"),
        ({"max_error_rate_delta": 2}, "max_error_rate_delta"),
        ({"max_ttft_p95_ratio": 0}, "max_ttft_p95_ratio"),
        ({"max_cost_ratio": float("inf")}, "max_cost_ratio"),
        ({"step_window_s": 0}, "step_window_s"),
        ({"step_window_s": 1.5}, "step_window_s"),
    ],
)
def test_create_refuses_bad_settings(create, overrides, field):
    with pytest.raises(ValidationError) as excinfo:
        create(**overrides)
    assert field in errors_of(excinfo)


def test_create_refuses_same_stable_and_candidate(create, stable):
    with pytest.raises(ValidationError) as excinfo:
        create(candidate_version=stable)
    assert errors_of(excinfo)["candidate_version"] == [
        "The candidate must differ from the stable version."
    ]


def test_create_refuses_unpublished_versions(create, llm, make_version):
    draft = make_version(llm, "v3", publish=False)
    with pytest.raises(ValidationError) as excinfo:
        create(candidate_version=draft)
    assert errors_of(excinfo)["candidate_version"] == ["Version tiny-llama:v3 is not published."]


def test_create_refuses_versions_of_another_model(create, make_version):
    other = model_create(actor=None, name="other", task="chat")
    foreign = make_version(other, "x1")
    with pytest.raises(ValidationError) as excinfo:
        create(stable_version=foreign)
    assert "is not a version of model 'tiny-llama'" in errors_of(excinfo)["stable_version"][0]


def test_second_active_rollout_is_refused_naming_the_first(create):
    first = create()
    with pytest.raises(ValidationError) as excinfo:
        create(mode="ab", steps=[50])
    [message] = errors_of(excinfo)["model"]
    assert f"already has an active rollout (#{first.pk}, pending: v1 → v2)" in message
    assert Rollout.objects.count() == 1


@pytest.mark.parametrize("state", ["running", "paused"])
def test_running_or_paused_rollouts_also_block_a_second(create, state):
    first = create()
    Rollout.objects.filter(pk=first.pk).update(state=state)
    with pytest.raises(ValidationError, match=f"#{first.pk}, {state}"):
        create()


def test_database_constraint_backs_the_rule(create, llm, stable, candidate):
    """A create that raced past the check is stopped by the partial unique index."""
    create()
    with pytest.raises(IntegrityError):
        Rollout.objects.create(model=llm, stable_version=stable, candidate_version=candidate)


def test_a_new_rollout_may_follow_a_cancelled_one(create):
    first = create()
    rollout_cancel(actor=None, rollout=first, reason="wrong candidate")
    second = create(mode="shadow", steps=[10])
    assert second.state == "pending"


def test_cancel_records_event_and_audit(create, admin_user):
    rollout = create()
    returned = rollout_cancel(actor=admin_user, rollout=rollout, reason="  regression in evals ")

    assert returned is rollout
    assert rollout.state == Rollout.State.CANCELLED
    event = RolloutEvent.objects.get(rollout=rollout, kind="cancelled")
    assert (event.from_state, event.to_state) == ("pending", "cancelled")
    assert (event.actor_label, event.reason) == (admin_user.username, "regression in evals")
    audit = AuditEvent.objects.get(action="rollout.cancel")
    assert audit.after == {"state": "cancelled", "reason": "regression in evals"}


def test_cancel_needs_a_reason(create):
    rollout = create()
    with pytest.raises(ValidationError) as excinfo:
        rollout_cancel(actor=None, rollout=rollout, reason="   ")
    assert "reason" in errors_of(excinfo)
    rollout.refresh_from_db()
    assert rollout.state == "pending"


@pytest.mark.parametrize("state", ["cancelled", "promoted", "rolled_back", "aborted", "running"])
def test_cancel_refuses_a_finished_rollout(create, state):
    rollout = create()
    Rollout.objects.filter(pk=rollout.pk).update(state=state)
    with pytest.raises(ValidationError, match=f"is {state}; only a draft or warming"):
        rollout_cancel(actor=None, rollout=rollout, reason="again")
