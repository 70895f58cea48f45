"""The warm-up: digest verified, a candidate replica started by the local scaling actuator,
warm-up requests over representative shapes sent to it (real simulator processes), health,
``ready``; any failure aborts with the reason. After a rollback the replica the warm-up started
is drained and stopped; stable's endpoint is never touched."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.router import Process

from apps.models.models import Endpoint, ModelVersion, Pool, Route
from apps.models.services import endpoint_register, endpoint_set_state
from apps.rollouts.models import Rollout, RolloutEvent
from apps.rollouts.services import rollout_create
from apps.rollouts.transitions import rollout_rollback, rollout_start
from apps.rollouts.warmup import Warmup, WarmupError, _call, rollout_warm_up
from apps.scaling.tasks import ENV_ACTUATOR, actuator_from_env
from config.celery import app
from tests.apps.rollouts.support import answers, start_simulator

pytestmark = [pytest.mark.db, pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def canary(llm, stable, candidate):
    def make(**extra: Any) -> Rollout:
        rollout = rollout_create(
            actor=None, model=llm, stable_version=stable, candidate_version=candidate,
            mode="canary", steps=[10, 100], **extra,
        )  # fmt: skip
        return rollout_start(actor=None, rollout=rollout)

    return make


def abort_reason(rollout: Rollout) -> str:
    assert rollout.state == "aborted"
    assert not Route.objects.filter(model=rollout.model).exists()  # no traffic ever moved
    return RolloutEvent.objects.get(rollout=rollout, kind="abort").reason


def test_a_healthy_ready_candidate_is_warmed_and_runs(canary, ready_endpoints):
    ready_endpoints()
    rollout = rollout_warm_up(actor=None, rollout=canary())

    assert (rollout.state, rollout.current_step, rollout.warmup_endpoints) == ("running", 0, [])
    warmup = RolloutEvent.objects.get(rollout=rollout, kind="warmed").data["warmup"]
    assert "verified" in warmup["artifact"]
    assert [c["check"] for c in warmup["checks"]] == ["short unary", "long streamed", "health"]


def test_a_digest_mismatch_aborts_before_any_request(canary, ready_endpoints, candidate):
    ready_endpoints()
    path = Path(candidate.artifact_uri.removeprefix("file://")) / "model.safetensors"
    path.write_bytes(b"tampered")
    rollout = rollout_warm_up(actor=None, rollout=canary())

    reason = abort_reason(rollout)
    assert reason.startswith("Warmup failed: the artifact of tiny-llama:v2 does not verify")
    assert "differing files: model.safetensors" in reason
    data = RolloutEvent.objects.get(rollout=rollout, kind="abort").data["warmup"]
    assert data["checks"] == []


def test_an_artifact_folder_only_the_model_hosts_have_is_left_to_their_worker(
    canary, ready_endpoints, candidate
):
    ready_endpoints()
    ModelVersion.objects.filter(pk=candidate.pk).update(artifact_uri="file:///nonexistent/v2")
    rollout = rollout_warm_up(actor=None, rollout=canary())
    assert rollout.state == "running"
    warmup = RolloutEvent.objects.get(rollout=rollout, kind="warmed").data["warmup"]
    assert warmup["artifact"] == (
        "/nonexistent/v2: not on this host; the worker that loads it verifies the digest"
    )


@pytest.fixture
def failing_simulator() -> Iterator[Process]:
    process = start_simulator("--error-rate", "1")
    try:
        yield process
    finally:
        process.stop()


def test_a_candidate_that_fails_its_warmup_requests_aborts(
    canary, ready_endpoints, stable, candidate, failing_simulator
):
    ready_endpoints(stable)
    pool = Endpoint.objects.get(version=stable).pool
    endpoint = endpoint_register(
        actor=None, pool=pool, version=candidate, base_url=failing_simulator.base_url, capacity=4
    )
    endpoint_set_state(actor=None, endpoint=endpoint, state="ready")
    reason = abort_reason(rollout_warm_up(actor=None, rollout=canary()))
    assert reason.startswith(
        f"Warmup failed: warm-up request 'short unary' to {endpoint.base_url}: HTTP 500"
    )


def test_the_warmup_is_bounded_in_time(canary, ready_endpoints, settings):
    ready_endpoints()
    settings.ROLLOUT_WARMUP_TIMEOUT_S = 0.0
    reason = abort_reason(rollout_warm_up(actor=None, rollout=canary()))
    assert reason == "Warmup failed: the warm-up ran out of time (ROLLOUT_WARMUP_TIMEOUT_S)"


@pytest.fixture
def local_actuator(settings, monkeypatch, tmp_path, router_namespace) -> Iterator[None]:
    """The scaling settings choose the local actuator (as ``up`` with autoscaling does)."""
    settings.VAR_DIR = tmp_path / "var"
    (tmp_path / "var" / "log" / "replicas").mkdir(parents=True)
    monkeypatch.setenv(ENV_ACTUATOR, "local")
    try:
        yield
    finally:
        actuator = actuator_from_env()
        for pool in Pool.objects.all():  # whatever a failed test left running
            actuator.stop_all(pool)  # type: ignore[union-attr]


def test_the_actuator_starts_the_candidate_and_a_rollback_drains_it(
    canary, ready_endpoints, stable, candidate, local_actuator, django_capture_on_commit_callbacks
):
    (stable_endpoint,) = ready_endpoints(stable)  # the candidate has no replica yet
    rollout = rollout_warm_up(actor=None, rollout=canary())

    assert rollout.state == "running", RolloutEvent.objects.filter(rollout=rollout).last()
    (started,) = rollout.warmup_endpoints
    endpoint = Endpoint.objects.get(pk=started)
    assert (endpoint.version_id, endpoint.state, endpoint.pool_id) == (
        candidate.pk, "ready", stable_endpoint.pool_id,
    )  # fmt: skip
    assert answers(endpoint.base_url)
    warmup = RolloutEvent.objects.get(rollout=rollout, kind="warmed").data["warmup"]
    assert warmup["started"] == [started]
    checks = [c["check"] for c in warmup["checks"]]
    assert checks == ["replica started", "short unary", "long streamed", "health"]

    app.conf.task_always_eager = True
    try:
        with django_capture_on_commit_callbacks(execute=True):
            rollout_rollback(actor=None, rollout=rollout, reason="operator says no")
    finally:
        app.conf.task_always_eager = False

    endpoint.refresh_from_db()
    stable_endpoint.refresh_from_db()
    assert (endpoint.state, stable_endpoint.state) == ("gone", "ready")
    assert not answers(endpoint.base_url)  # the process was stopped
    assert answers(stable_endpoint.base_url)
    drain = RolloutEvent.objects.get(rollout=rollout, kind="drain")
    assert (drain.data, drain.to_state) == ({"endpoints": [started]}, "rolled_back")


def test_a_candidate_without_replica_and_no_actuator_aborts(canary, ready_endpoints, stable):
    ready_endpoints(stable)
    reason = abort_reason(rollout_warm_up(actor=None, rollout=canary()))
    assert "has no ready endpoint and no configured scaling actuator" in reason


def test_an_abort_after_the_actuator_started_a_replica_drains_it(
    canary, ready_endpoints, stable, local_actuator, settings
):
    (stable_endpoint,) = ready_endpoints(stable)
    # Enough time to ask for a replica, not to warm it: a Python process that serves HTTP takes
    # well over 0.3 s to start, so the warm-up runs out of time right after the start.
    settings.ROLLOUT_WARMUP_TIMEOUT_S = 0.3
    rollout = rollout_warm_up(actor=None, rollout=canary())

    assert "ran out of time" in abort_reason(rollout)
    (started,) = rollout.warmup_endpoints
    endpoint = Endpoint.objects.get(pk=started)
    stable_endpoint.refresh_from_db()
    assert (endpoint.state, stable_endpoint.state) == ("gone", "ready")
    assert not answers(endpoint.base_url)
    drain = RolloutEvent.objects.get(rollout=rollout, kind="drain")
    assert (drain.data, drain.to_state) == ({"endpoints": [started]}, "aborted")


def test_a_request_cut_by_the_warmup_deadline_says_the_time_ran_out() -> None:
    # A replica that accepts the connection but never answers: the request's socket timeout is
    # what was left of the warm-up, so the abort names the warm-up's timeout, not the socket's.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        port = silent.getsockname()[1]
        warmup = Warmup(deadline=time.monotonic() + 0.2)
        with pytest.raises(WarmupError, match="ran out of time"):
            _call(warmup, f"http://127.0.0.1:{port}/health", None, 5.0)
