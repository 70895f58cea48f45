"""A rollout carried out by real Celery processes: a worker and beat (on a private broker),
a real router, simulator replicas.

The operator's button enqueues ``rollout_start``; the worker warms the candidate up (the local
scaling actuator starts its simulator replica, warm-up requests, ``ready``), the rollout runs
its first canary step, users' traffic flows through the router, beat evaluates the gates every
0.5 s, and the candidate (priced twice as much per token: "correct but too expensive") fails the
cost gate and is rolled back automatically, then drained and stopped.

Measured: the time from the gate's decision to the last user request routed to the candidate
(goal < 2 s); users saw no failed request.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery
from django.db import connections
from fixtures.celery_worker import Beat, Worker, database_url
from fixtures.control_plane import endpoint_ready, tenants_with_keys, version_published
from fixtures.redis_keys import RouterNamespace
from fixtures.redis_server import private_redis
from fixtures.router import Process, redis_url, start_router, wait_ready
from fixtures.wait import eventually

from apps.billing.services import price_set
from apps.models.models import Endpoint, Pool
from apps.models.services import model_create, pool_create, route_set
from apps.rollouts.models import Rollout, RolloutEvent
from apps.rollouts.services import rollout_create
from apps.scaling.actuators.local import LocalActuator
from runtime import contract, snapshot_store
from tests.apps.rollouts.support import (
    MODEL,
    Sent,
    answers,
    artifact,
    rollout_state,
    start_simulator,
    traffic_until,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timing,
    pytest.mark.django_db(transaction=True),
]

TENANTS = [f"team-{i}" for i in range(12)]


@dataclass
class Stage:
    prefix: str
    router: Process
    keys: dict[str, str]
    rollout: Rollout
    stable_endpoint: Endpoint
    broker_url: str


def _world(tmp_path: Path) -> tuple[Rollout, Endpoint, dict[str, str], Process]:
    # Stable runs as the local actuator runs the candidate: only the price differs.
    stable_sim = start_simulator("--decode-a-ms", "10", "--max-num-seqs", "8")
    model = model_create(actor=None, name=MODEL, task="chat")
    pool = pool_create(actor=None, name="sim", hardware_tier="cpu", cost_per_replica_hour="1")
    versions = []
    for label in ("v1", "v2"):
        folder = artifact(tmp_path / "artifacts" / label, content=label.encode())
        versions.append(version_published(model, label, runtime="simulator", **folder))
    stable, candidate = versions
    price_set(actor=None, version=stable, hardware_tier="cpu", input_per_1k="1", output_per_1k="2")
    price_set(actor=None, version=candidate, hardware_tier="cpu",
              input_per_1k="2", output_per_1k="4")  # fmt: skip
    endpoint = endpoint_ready(pool, stable, stable_sim.base_url)
    route_set(actor=None, model=model, splits=[(stable, 100)])
    keys = tenants_with_keys(TENANTS, credits="1000")
    rollout = rollout_create(
        actor=None, model=model, stable_version=stable, candidate_version=candidate,
        mode="canary", steps=[25, 50, 100], min_samples=15, step_window_s=2,
    )  # fmt: skip
    return rollout, endpoint, keys, stable_sim


@pytest.fixture
def stage(router_namespace: RouterNamespace, tmp_path: Path) -> Iterator[Stage]:
    namespace, prefix = router_namespace.name, router_namespace.prefix
    var_dir = tmp_path / "var"
    (var_dir / "log" / "replicas").mkdir(parents=True)
    started: list[Any] = []
    try:
        with private_redis(tmp_path) as broker:
            try:
                rollout, stable_endpoint, keys, stable_sim = _world(tmp_path)
                started.append(stable_sim)
                env = {
                    **os.environ, "DATABASE_URL": database_url(), "REDIS_URL": redis_url(),
                    "CELERY_BROKER_URL": broker.url, "CELERY_RESULT_BACKEND": broker.url,
                    contract.ENV_SNAPSHOT_PREFIX: prefix, "SWITCHYARD_VAR_DIR": str(var_dir),
                    "SWITCHYARD_SCALING_ACTUATOR": "local",
                    "SWITCHYARD_ROLLOUT_EVALUATE_S": "0.5",
                    "SWITCHYARD_BEAT_ONLY": "evaluate-rollout-gates,drain-snapshot-outbox",
                }  # fmt: skip
                started.append(Worker("celery", env))
                started.append(Beat(env, tmp_path / "beat"))
                router = start_router(prefix, tmp_path / "router")
                started.append(router)
                wait_ready(router, router_namespace.latest())
                yield Stage(prefix, router, keys, rollout, stable_endpoint, broker.url)
                connections.close_all()
            finally:
                for process in reversed(started):
                    if isinstance(process, Worker | Beat):  # shown when the test fails
                        print(process.output()[-4000:])
                    process.stop()
    finally:
        actuator = LocalActuator(redis_url=redis_url(), namespace=namespace, log_dir=var_dir)
        for pool in Pool.objects.all():  # a replica the test's drain did not stop
            actuator.stop_all(pool)


async def drive(stage: Stage, *, budget_s: float) -> list[Sent]:
    """Traffic from every tenant (4 in flight) until the rollout leaves ``running`` (bounded
    by ``budget_s``), then 3 s more."""

    async def watch() -> None:
        give_up = time.monotonic() + budget_s
        while time.monotonic() < give_up:
            if await asyncio.to_thread(rollout_state, stage.rollout.pk) != "running":
                return
            await asyncio.sleep(0.2)

    return await traffic_until(stage.router, stage.keys, TENANTS, watch, tail_s=3.0)


def test_beat_rolls_back_a_too_expensive_candidate_the_worker_warmed_up(stage: Stage) -> None:
    started = time.monotonic()
    # What the admin's button does. Not the current app: shared tasks bind to the current app,
    # so later tests would send through this test's (stopped) private broker.
    button = Celery("operator", broker=stage.broker_url, set_as_current=False)
    try:
        button.send_task(
            "apps.rollouts.tasks.rollout_start", kwargs={"rollout_id": stage.rollout.pk}
        )
    finally:
        button.close()
    eventually(lambda: rollout_state(stage.rollout.pk) not in ("pending", "warming"), timeout=90,
               what="the worker's warm-up")  # fmt: skip
    stage.rollout.refresh_from_db()
    events = list(stage.rollout.events.values_list("kind", "reason"))
    assert stage.rollout.state == "running", events
    (candidate_id,) = stage.rollout.warmup_endpoints
    candidate = Endpoint.objects.get(pk=candidate_id)
    assert (candidate.state, candidate.version_id) == ("ready", stage.rollout.candidate_version_id)
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
    try:
        wait_ready(stage.router, snapshot_store.latest_version(client, prefix=stage.prefix) or 0)
    finally:
        client.close()

    sent = asyncio.run(drive(stage, budget_s=60))

    stage.rollout.refresh_from_db()
    kinds = [e.kind for e in stage.rollout.events.all()]
    assert stage.rollout.state == "rolled_back", kinds
    event = RolloutEvent.objects.get(rollout=stage.rollout, kind="rollback")
    assert (event.reason, event.actor_label) == ("Gate failed: cost.", "system")
    cost = next(g for g in event.data["evidence"]["gates"] if g["gate"] == "cost")
    assert cost["ratio"] == pytest.approx(2.0, rel=0.05)
    decided_at = event.data["evidence"]["decided_at"]
    to_candidate = [s for s in sent if s.version == "v2"]
    assert to_candidate, "no request reached the candidate"
    lag = max(s.at for s in to_candidate) - decided_at
    assert {s.status for s in sent} == {200}, [s.status for s in sent if s.status != 200][:10]
    after = [s for s in sent if s.at > decided_at + 2.0]
    assert after
    assert {s.version for s in after} == {"v1"}
    # The candidate's replica (started by the warm-up) is drained and stopped; stable stays.
    eventually(lambda: RolloutEvent.objects.filter(rollout=stage.rollout, kind="drain").exists(),
               timeout=60, what="the drain task")  # fmt: skip
    candidate.refresh_from_db()
    stage.stable_endpoint.refresh_from_db()
    assert (candidate.state, stage.stable_endpoint.state) == ("gone", "ready")
    assert not answers(candidate.base_url)
    took = time.monotonic() - started
    print(f"beat rollback: {len(sent)} requests ({len(to_candidate)} to the candidate); "
          f"decision -> last request routed to the candidate {lag * 1000:.0f} ms; "
          f"whole test body {took:.0f} s")  # fmt: skip
    assert lag < 2.0
