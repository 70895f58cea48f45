"""Operator rollout actions over REST: each POST queues its Celery task (202 + task id); the
task status endpoint reports the new state, or the service's refusal as a FAILURE.

Celery runs eagerly here with results stored in the real result backend (Redis), so the
status endpoint reads what a worker would have recorded.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.router import Process
from rest_framework.test import APIClient

from apps.models.models import Endpoint, ModelVersion
from apps.models.services import (
    endpoint_register,
    model_version_create,
    model_version_publish,
)
from apps.models.services.fleet import endpoint_set_state
from apps.rollouts import tasks
from apps.rollouts.models import Rollout, RolloutEvent
from apps.rollouts.services import rollout_create
from config.celery import app
from tests.api.conftest import World
from tests.apps.rollouts.support import artifact, start_simulator

pytestmark = pytest.mark.db

OPS = "/api/v1/ops"
ACTIONS = ("start", "advance", "pause", "resume", "promote", "rollback")


@pytest.fixture
def eager_celery(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Run tasks in the request, storing results in the backend; forget them afterwards."""
    app.conf.task_always_eager = True
    for name in ACTIONS:
        # A task reads task_store_eager_result once, when first bound: set it on each task.
        monkeypatch.setattr(getattr(tasks, f"rollout_{name}"), "store_eager_result", True)
    seen: list[str] = []
    try:
        yield seen
    finally:
        app.conf.task_always_eager = False
        for task_id in seen:
            app.backend.forget(task_id)


@pytest.fixture(scope="module")
def simulator() -> Iterator[Process]:
    """The candidate's replica (the warm-up sends its requests to it)."""
    process = start_simulator()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture
def candidate(world: World, tmp_path: Path, simulator: Process) -> ModelVersion:
    version = model_version_create(
        actor=None, model=world.model, label="v2", runtime="vllm", **artifact(tmp_path / "v2")
    )
    return model_version_publish(actor=None, version=version)


def _ready(world: World, *versions: ModelVersion, url: str = "") -> None:
    """Ready endpoints for ``versions``; the candidate's (v2) at ``url``, a real simulator."""
    for version in versions:
        endpoint = Endpoint.objects.filter(version=version).first() or endpoint_register(
            actor=None,
            pool=world.pool,
            version=version,
            base_url=url or f"http://127.0.0.1:{9100 + version.pk}",
            capacity=4,
        )
        endpoint_set_state(actor=None, endpoint=endpoint, state="ready")


def _rollout(world: World, candidate: ModelVersion, mode: str = "canary", **extra: Any) -> Rollout:
    return rollout_create(
        actor=None,
        model=world.model,
        stable_version=world.version,
        candidate_version=candidate,
        mode=mode,
        **extra,
    )


def _act(
    client: APIClient, seen: list[str], rollout: Rollout, action: str, **body: Any
) -> dict[str, Any]:
    """POST the action, expect 202, and return the task's status as the API reports it."""
    response = client.post(f"{OPS}/rollouts/{rollout.pk}/{action}/", body, format="json")
    assert response.status_code == 202, (action, response.content)
    task_id = response.json()["task_id"]
    seen.append(task_id)
    assert response.json()["status_url"].endswith(f"/api/v1/ops/tasks/{task_id}/")
    status = client.get(f"{OPS}/tasks/{task_id}/")
    assert status.status_code == 200
    result: dict[str, Any] = status.json()
    assert result["task_id"] == task_id
    return result


def _done(result: dict[str, Any]) -> str:
    assert (result["state"], result["error"]) == ("SUCCESS", None), result
    return str(result["result"])


def test_canary_through_every_action(
    world: World,
    candidate: ModelVersion,
    simulator: Process,
    staff_client: APIClient,
    eager_celery: list[str],
) -> None:
    _ready(world, world.version)
    _ready(world, candidate, url=simulator.base_url)
    rollout = _rollout(world, candidate, steps=[5, 25, 50, 100])
    act = lambda action, **body: _act(staff_client, eager_celery, rollout, action, **body)  # noqa: E731
    assert _done(act("start")) == "running"
    assert _done(act("advance", reason="gates green")) == "running"
    assert _done(act("pause", reason="holiday")) == "paused"
    assert _done(act("resume")) == "running"
    assert _done(act("promote", reason="good enough")) == "promoted"
    detail = staff_client.get(f"{OPS}/rollouts/{rollout.pk}/").json()
    assert (detail["state"], detail["current_step"]) == ("promoted", 3)
    events = [(e["kind"], e["reason"], e["actor_label"]) for e in detail["events"]]
    assert events[1:] == [
        ("start", "", "operator"),
        ("warmed", "", "operator"),
        ("advance", "gates green", "operator"),
        ("pause", "holiday", "operator"),
        ("resume", "", "operator"),
        ("promote", "good enough", "operator"),
    ]
    route = staff_client.get(f"{OPS}/routes/{world.model.pk}/").json()
    assert [(s["version"], s["weight"]) for s in route["splits"]] == [(candidate.pk, 100)]


def test_rollback_needs_a_reason_and_restores_stable(
    world: World,
    candidate: ModelVersion,
    simulator: Process,
    staff_client: APIClient,
    eager_celery: list[str],
) -> None:
    _ready(world, world.version)
    _ready(world, candidate, url=simulator.base_url)
    rollout = _rollout(world, candidate)
    assert _done(_act(staff_client, eager_celery, rollout, "start")) == "running"
    url = f"{OPS}/rollouts/{rollout.pk}/rollback/"
    for body in ({}, {"reason": "  "}):
        refused = staff_client.post(url, body, format="json")
        assert refused.status_code == 400, refused.content
        assert set(refused.json()["error"]["fields"]) == {"reason"}
    rolled = _act(staff_client, eager_celery, rollout, "rollback", reason="errors up")
    assert _done(rolled) == "rolled_back"
    event = RolloutEvent.objects.filter(rollout=rollout).latest("id")
    assert (event.kind, event.reason) == ("rollback", "errors up")
    route = staff_client.get(f"{OPS}/routes/{world.model.pk}/").json()
    assert [(s["version"], s["weight"]) for s in route["splits"]] == [(world.version.pk, 100)]


def _refused(result: dict[str, Any]) -> str:
    assert (result["state"], result["result"]) == ("FAILURE", None), result
    return str(result["error"])


def test_refused_transitions_fail_the_task_with_the_services_message(
    world: World, candidate: ModelVersion, staff_client: APIClient, eager_celery: list[str]
) -> None:
    rollout = _rollout(world, candidate)
    act = lambda action, **body: _act(staff_client, eager_celery, rollout, action, **body)  # noqa: E731
    pending = f"Rollout #{rollout.pk} is pending"
    assert f"{pending}; advance needs it to be running." in _refused(act("advance"))
    assert f"{pending}; pause needs it to be running." in _refused(act("pause"))
    assert f"{pending}; resume needs it to be paused." in _refused(act("resume"))
    assert f"{pending}; promote needs it to be running or paused." in _refused(act("promote"))
    assert "rollback needs it to be warming or running or paused" in _refused(
        act("rollback", reason="never started")
    )
    rollout.refresh_from_db()
    assert rollout.state == "pending"
    # The warmup is no refusal: the start succeeds and the rollout aborts with the reason.
    assert _done(act("start")) == "aborted"
    event = RolloutEvent.objects.filter(rollout=rollout).latest("id")
    assert event.reason.startswith("Warmup failed: the candidate v2 has no ready endpoint")
    assert f"Rollout #{rollout.pk} is aborted; start needs it to be pending." in _refused(
        act("start")
    )


def test_a_non_canary_cannot_advance(
    world: World,
    candidate: ModelVersion,
    simulator: Process,
    staff_client: APIClient,
    eager_celery: list[str],
) -> None:
    _ready(world, world.version)
    _ready(world, candidate, url=simulator.base_url)
    rollout = _rollout(world, candidate, mode="ab", steps=[50])
    assert _done(_act(staff_client, eager_celery, rollout, "start")) == "running"
    error = _refused(_act(staff_client, eager_celery, rollout, "advance"))
    assert "is a ab rollout at its only step; promote or roll it back instead." in error


@pytest.mark.parametrize("action", ACTIONS)
def test_unknown_rollout_is_404_and_nothing_is_queued(
    world: World, staff_client: APIClient, eager_celery: list[str], action: str
) -> None:
    response = staff_client.post(f"{OPS}/rollouts/999999/{action}/", {"reason": "x"}, format="json")
    assert response.status_code == 404, response.content
    assert response.json()["error"]["code"] == "not_found"


def test_actions_are_queued_when_no_worker_runs(
    world: World, candidate: ModelVersion, staff_client: APIClient
) -> None:
    rollout = _rollout(world, candidate)
    response = staff_client.post(f"{OPS}/rollouts/{rollout.pk}/start/")
    assert response.status_code == 202, response.content
    task_id = response.json()["task_id"]
    try:
        status = staff_client.get(f"{OPS}/tasks/{task_id}/").json()
        assert status["state"] == "PENDING"
        rollout.refresh_from_db()
        assert rollout.state == "pending"  # nothing ran in the request
    finally:
        app.control.purge()


def test_create_takes_the_itl_threshold_and_a_sticky_header(
    world: World, candidate: ModelVersion, staff_client: APIClient
) -> None:
    body = {"model": world.model.pk, "stable_version": world.version.pk,
            "candidate_version": candidate.pk, "mode": "ab", "steps": [50]}  # fmt: skip
    refused = staff_client.post(
        f"{OPS}/rollouts/", {**body, "sticky_header": "Authorization"}, format="json"
    )
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"]["fields"] == {
        "sticky_header": [
            "'Authorization' cannot assign versions; use a header such as X-Session-Id."
        ]
    }
    created = staff_client.post(
        f"{OPS}/rollouts/",
        {**body, "sticky_header": "X-Session-Id", "max_itl_p95_ratio": 1.5},
        format="json",
    )
    assert created.status_code == 201, created.content
    document = created.json()
    assert (document["sticky_header"], document["max_itl_p95_ratio"]) == ("x-session-id", 1.5)
    assert document["warmup_endpoints"] == []
