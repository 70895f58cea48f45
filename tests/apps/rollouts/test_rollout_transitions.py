"""The rollout state machine: each action moves the route (and so the snapshot), records an
event and an audit entry, and refuses from the wrong state; the Celery tasks and the admin
buttons call the same services."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from apps.common.models import AuditEvent
from apps.core.selectors import snapshot_build
from apps.models.models import Route
from apps.rollouts import tasks
from apps.rollouts.models import Rollout, RolloutEvent
from apps.rollouts.services import rollout_create
from apps.rollouts.transitions import (
    rollout_advance,
    rollout_pause,
    rollout_promote,
    rollout_resume,
    rollout_rollback,
    rollout_start,
)
from apps.rollouts.warmup import rollout_warm_up
from config.celery import app

pytestmark = [pytest.mark.db, pytest.mark.django_db]


@pytest.fixture
def canary(llm, stable, candidate):
    def make(**kwargs: Any) -> Rollout:
        values: dict[str, Any] = {"mode": "canary", "steps": [10, 50, 100], **kwargs}
        return rollout_create(
            actor=None, model=llm, stable_version=stable, candidate_version=candidate, **values
        )

    return make


def weights(rollout: Rollout) -> dict[str, int]:
    route = Route.objects.get(model=rollout.model)
    return {s.version.label: s.weight for s in route.splits.select_related("version")}


def running(rollout: Rollout) -> Rollout:
    rollout_start(actor=None, rollout=rollout)
    return rollout_warm_up(actor=None, rollout=rollout)


def test_warmup_without_ready_endpoints_aborts_with_the_reason(canary, ready_endpoints, stable):
    ready_endpoints(stable)  # the candidate has none
    rollout = canary()
    rollout_start(actor=None, rollout=rollout)
    assert rollout.state == "warming"
    rollout_warm_up(actor=None, rollout=rollout)

    assert rollout.state == "aborted"
    event = RolloutEvent.objects.get(rollout=rollout, kind="abort")
    assert event.reason == (
        "Warmup failed: the candidate v2 has no ready endpoint and no configured scaling "
        "actuator can start one (SWITCHYARD_SCALING_ACTUATOR=local)"
    )
    assert not Route.objects.filter(model=rollout.model).exists()  # no traffic moved


def test_a_canary_walks_its_steps_to_promotion(canary, ready_endpoints, publishes, admin_user):
    ready_endpoints()
    rollout = canary(excluded_tenants=["bank"])
    publishes.reset()
    running(rollout)

    assert (rollout.state, rollout.current_step) == ("running", 0)
    assert rollout.step_started_at is not None
    assert weights(rollout) == {"v1": 90, "v2": 10}
    assert publishes.pending
    route = snapshot_build().routes[rollout.model.name]
    assert (route.stable_version, route.exclude_tenants) == (rollout.stable_version_id, ("bank",))

    rollout_advance(actor=admin_user, rollout=rollout, reason="looks fine")
    assert (rollout.current_step, weights(rollout)) == (1, {"v1": 50, "v2": 50})

    rollout_advance(actor=admin_user, rollout=rollout)  # onto the 100 % step: promotion
    assert rollout.state == "promoted"
    assert weights(rollout) == {"v2": 100}
    assert snapshot_build().routes[rollout.model.name].exclude_tenants == ()
    kinds = list(RolloutEvent.objects.filter(rollout=rollout).values_list("kind", flat=True))
    assert kinds == ["created", "start", "warmed", "advance", "promote"]
    audit = AuditEvent.objects.filter(action="rollout.advance").get()
    assert audit.actor_label == admin_user.username
    assert audit.after["current_step"] == 1


def test_pause_holds_the_share_and_resume_restarts_the_step_clock(canary, ready_endpoints):
    ready_endpoints()
    rollout = running(canary())
    first_start = rollout.step_started_at
    rollout_pause(actor=None, rollout=rollout, reason="investigating")

    assert rollout.state == "paused"
    assert weights(rollout) == {"v1": 90, "v2": 10}
    with pytest.raises(ValidationError, match="advance needs it to be running"):
        rollout_advance(actor=None, rollout=rollout)
    rollout_resume(actor=None, rollout=rollout)
    assert rollout.state == "running"
    assert rollout.step_started_at > first_start


def test_rollback_sends_everything_to_stable_in_one_publish(canary, ready_endpoints, publishes):
    ready_endpoints()
    rollout = running(canary())
    rollout_advance(actor=None, rollout=rollout)
    publishes.reset()
    rollout_rollback(actor=None, rollout=rollout, reason="p95 doubled", evidence={"x": 1})

    assert rollout.state == "rolled_back"
    assert weights(rollout) == {"v1": 100}
    assert publishes.pending
    snap_route = snapshot_build().routes[rollout.model.name]
    assert [s.version for s in snap_route.splits] == [rollout.stable_version_id]
    event = RolloutEvent.objects.get(rollout=rollout, kind="rollback")
    assert (event.from_state, event.reason, event.data) == (
        "running",
        "p95 doubled",
        {"evidence": {"x": 1}, "candidate_share": 0},
    )


def test_actions_refuse_from_the_wrong_state(canary, ready_endpoints):
    ready_endpoints()
    rollout = canary()
    with pytest.raises(ValidationError, match="pause needs it to be running"):
        rollout_pause(actor=None, rollout=rollout)
    with pytest.raises(ValidationError, match="promote needs"):
        rollout_promote(actor=None, rollout=rollout)
    with pytest.raises(ValidationError, match="rollback needs"):
        rollout_rollback(actor=None, rollout=rollout, reason="x")
    with pytest.raises(ValidationError, match="Say why"):
        rollout_rollback(actor=None, rollout=rollout, reason=" ")
    running(rollout)
    with pytest.raises(ValidationError, match="start needs it to be pending"):
        rollout_start(actor=None, rollout=rollout)
    with pytest.raises(ValidationError, match="resume needs it to be paused"):
        rollout_resume(actor=None, rollout=rollout)


def test_an_ab_rollout_holds_its_split_until_promoted(llm, stable, candidate, ready_endpoints):
    ready_endpoints()
    rollout = rollout_create(
        actor=None, model=llm, stable_version=stable, candidate_version=candidate,
        mode="ab", steps=[30],
    )  # fmt: skip
    running(rollout)
    assert weights(rollout) == {"v1": 70, "v2": 30}
    with pytest.raises(ValidationError, match="ab rollout at its only step"):
        rollout_advance(actor=None, rollout=rollout)
    rollout_promote(actor=None, rollout=rollout)
    assert weights(rollout) == {"v2": 100}


def test_a_shadow_rollout_keeps_the_route_on_stable(llm, stable, candidate, ready_endpoints):
    ready_endpoints()
    rollout = rollout_create(
        actor=None, model=llm, stable_version=stable, candidate_version=candidate,
        mode="shadow", steps=[20],
    )  # fmt: skip
    running(rollout)
    route = snapshot_build().routes[llm.name]
    assert (route.shadow_version, route.shadow_share) == (candidate.pk, 0.2)
    assert [s.version for s in route.splits] == [stable.pk]


def test_the_blast_radius_bounds_each_step(canary):
    with pytest.raises(ValidationError, match="more than 20 points"):
        canary(steps=[5, 50, 100], max_step_increase=20)
    assert canary(steps=[5, 25, 45, 100], max_step_increase=20).state == "pending"


def test_excluded_tenants_must_be_slugs(canary):
    with pytest.raises(ValidationError, match="list of tenant slugs"):
        canary(excluded_tenants=["ok", ""])


def test_tasks_call_the_services(canary, ready_endpoints, admin_user):
    ready_endpoints()
    rollout = canary()
    def run(task, **kwargs):
        return task.apply(kwargs={"rollout_id": rollout.pk, **kwargs}).get()

    assert run(tasks.rollout_start, actor_id=admin_user.pk) == "running"
    assert run(tasks.rollout_pause) == "paused"
    assert run(tasks.rollout_resume) == "running"
    assert run(tasks.rollout_advance) == "running"
    assert run(tasks.rollout_rollback, reason="bad") == "rolled_back"
    event = RolloutEvent.objects.get(rollout=rollout, kind="start")
    assert event.actor_label == admin_user.username


@pytest.fixture
def eager_celery():
    app.conf.task_always_eager = True
    yield
    app.conf.task_always_eager = False


def test_admin_buttons_work_mid_rollout(admin_client, canary, ready_endpoints, eager_celery):
    ready_endpoints()
    rollout = canary()
    url = reverse("admin:rollouts_rollout_changelist")

    def press(action: str) -> str:
        response = admin_client.post(url, {"action": action, "_selected_action": [rollout.pk]})
        assert response.status_code == 302
        rollout.refresh_from_db()
        return rollout.state

    assert press("start_selected") == "running"
    assert press("advance_selected") == "running"
    assert rollout.current_step == 1
    assert press("pause_selected") == "paused"
    assert press("advance_selected") == "paused"  # refused: shown as a message, nothing queued
    assert press("resume_selected") == "running"
    assert press("rollback_selected") == "rolled_back"
    assert weights(rollout) == {"v1": 100}
    labels = set(RolloutEvent.objects.filter(rollout=rollout).values_list("actor_label", flat=True))
    assert "admin" in labels
