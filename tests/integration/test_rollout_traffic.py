"""Rollouts moving real traffic: the control plane's services change the route, the published
snapshot reaches a real router process, simulator endpoints answer, the router's per-version
telemetry lands in Redis, and the evaluator (the beat task's service, called in a loop here)
advances, promotes or rolls back.

Measured: the time from the gate's rollback decision to the last request the router routed to
the candidate (goal: under 2 s).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import redis
from django.db import connections
from fixtures.control_plane import endpoint_ready, tenants_with_keys, version_published
from fixtures.redis_keys import RouterNamespace
from fixtures.router import Process, http_get, start_router, wait_ready
from fixtures.wait import eventually

from apps.models.services import model_create, pool_create, route_set
from apps.rollouts.evaluate import rollouts_evaluate_running
from apps.rollouts.models import Rollout, RolloutEvent
from apps.rollouts.services import rollout_create
from apps.rollouts.transitions import rollout_pause, rollout_resume, rollout_start
from apps.rollouts.warmup import rollout_warm_up
from runtime import contract, snapshot_store
from runtime.routing.versions import choose_version
from runtime.telemetry.versions import read_window
from tests.apps.rollouts.support import (
    Sent,
    artifact,
    rollout_state,
    send_one,
    start_simulator,
    traffic_until,
)

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timing,
    pytest.mark.django_db(transaction=True),
]

MODEL = "tiny-llama"
TENANTS = [f"team-{i}" for i in range(12)]
EXCLUDED = "bank"


@dataclass
class Stage:
    prefix: str
    router: Process
    keys: dict[str, str]
    rollout: Rollout
    client: redis.Redis[bytes]
    candidate_sim: Process

    def latest(self) -> int:
        version = snapshot_store.latest_version(self.client, prefix=self.prefix)
        assert version is not None
        return version


@pytest.fixture
def stage(
    router_namespace: RouterNamespace, tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Stage]:
    error_rate, mode, steps = getattr(request, "param", ("0", "canary", [25, 50, 100]))
    prefix = router_namespace.prefix
    started: list[Process] = []
    try:
        stable_sim = start_simulator()
        started.append(stable_sim)
        candidate_sim = start_simulator("--error-rate", error_rate, "--seed", "5")
        started.append(candidate_sim)
        model = model_create(actor=None, name=MODEL, task="chat")
        pool = pool_create(actor=None, name="sim", hardware_tier="cpu", cost_per_replica_hour="1")
        versions = []
        for label, sim in (("v1", stable_sim), ("v2", candidate_sim)):
            folder = artifact(tmp_path / "artifacts" / label)
            version = version_published(model, label, runtime="vllm", **folder)
            endpoint_ready(pool, version, sim.base_url)
            versions.append(version)
        route_set(actor=None, model=model, splits=[(versions[0], 100)])
        keys = tenants_with_keys([*TENANTS, EXCLUDED])
        rollout = rollout_create(
            actor=None, model=model, stable_version=versions[0], candidate_version=versions[1],
            mode=mode, steps=steps, min_samples=15, step_window_s=1,
            excluded_tenants=[EXCLUDED], sticky_header="X-Session-Id",
        )  # fmt: skip
        router = start_router(prefix, tmp_path / "router")
        started.append(router)
        stage = Stage(prefix, router, keys, rollout, router_namespace.client, candidate_sim)
        wait_ready(router, stage.latest())
        yield stage
    finally:
        for process in started:
            process.stop()


def evaluate_in_thread() -> dict[int, str]:
    try:
        return rollouts_evaluate_running()
    finally:
        connections.close_all()


async def drive(stage: Stage, *, until_state: set[str], budget_s: float) -> list[Sent]:
    """Traffic from every tenant (4 in flight) while the evaluator runs every 0.3 s, until the
    rollout reaches one of ``until_state`` (bounded by ``budget_s``), then 1 s more."""

    async def evaluator() -> None:
        give_up = time.monotonic() + budget_s
        while time.monotonic() < give_up:
            await asyncio.to_thread(evaluate_in_thread)
            state = await asyncio.to_thread(rollout_state, stage.rollout.pk)
            if state in until_state:
                return
            await asyncio.sleep(0.3)

    tenants = [*TENANTS, EXCLUDED]
    return await traffic_until(stage.router, stage.keys, tenants, evaluator, tail_s=1.0)


def start(stage: Stage) -> None:
    rollout_start(actor=None, rollout=stage.rollout)
    rollout_warm_up(actor=None, rollout=stage.rollout)  # digest, warm-up requests, health
    assert stage.rollout.state == "running", list(stage.rollout.events.values("reason"))
    wait_ready(stage.router, stage.latest())


@pytest.mark.parametrize("stage", [("0.5", "canary", [25, 50, 100])], indirect=True)
def test_an_erroring_candidate_is_rolled_back_fast_and_others_never_see_it(stage: Stage) -> None:
    start(stage)
    snapshot = snapshot_store.read_latest(stage.client, prefix=stage.prefix)
    assert snapshot is not None
    canary = {
        t for t in TENANTS
        if choose_version(snapshot, snapshot.models[MODEL], tenant=t).label == "v2"
    }  # fmt: skip
    assert canary, "the 25 % step put no tenant on the candidate"

    sent = asyncio.run(drive(stage, until_state={"rolled_back"}, budget_s=60))

    stage.rollout.refresh_from_db()
    assert stage.rollout.state == "rolled_back", [e.kind for e in stage.rollout.events.all()]
    event = RolloutEvent.objects.get(rollout=stage.rollout, kind="rollback")
    decided_at = event.data["evidence"]["decided_at"]
    to_candidate = [s for s in sent if s.version == "v2" or s.status >= 500]
    assert to_candidate, "no request reached the candidate"
    lag = max(s.at for s in to_candidate) - decided_at
    print(f"rollback: decision -> last request routed to the candidate: {lag * 1000:.0f} ms")
    assert lag < 2.0
    # Sticky: each tenant saw one version while the canary ran; outside it, no errors at all.
    before = [s for s in sent if s.at < decided_at]
    for tenant in TENANTS:
        seen = {s.version for s in before if s.tenant == tenant and s.status == 200}
        assert seen <= ({"v2"} if tenant in canary else {"v1"}), (tenant, seen)
    outside = [s for s in sent if s.tenant not in canary]
    assert outside
    assert {s.status for s in outside} == {200}
    assert {s.version for s in sent if s.tenant == EXCLUDED} == {"v1"}
    # After the rollback every tenant, the canary's included, gets stable's answers.
    after = asyncio.run(_each_tenant(stage))
    assert {(s.status, s.version) for s in after} == {(200, "v1")}


def test_a_healthy_candidate_ramps_to_promotion_with_manual_pause(stage: Stage) -> None:
    start(stage)
    rollout_pause(actor=None, rollout=stage.rollout, reason="operator looks first")
    assert rollouts_evaluate_running() == {}  # paused: nothing is decided
    rollout_resume(actor=None, rollout=stage.rollout)

    sent = asyncio.run(drive(stage, until_state={"promoted", "rolled_back"}, budget_s=90))

    stage.rollout.refresh_from_db()
    kinds = [e.kind for e in stage.rollout.events.all()]
    assert stage.rollout.state == "promoted", kinds
    assert kinds.count("advance") == 1
    assert {s.status for s in sent} == {200}
    wait_ready(stage.router, stage.latest())
    eventually(
        lambda: asyncio.run(_one_version(stage)) == "v2", timeout=5, what="all traffic on v2"
    )


async def _each_tenant(stage: Stage) -> list[Sent]:
    async with aiohttp.ClientSession() as http:
        return [await send_one(http, stage.router, stage.keys, tenant) for tenant in TENANTS]


async def _one_version(stage: Stage) -> str:
    async with aiohttp.ClientSession() as http:
        return (await send_one(http, stage.router, stage.keys, TENANTS[0])).version


def _candidate_served(stage: Stage) -> float:
    status, body = http_get(f"{stage.candidate_sim.base_url}/metrics")
    assert status == 200
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("vllm:request_success_total"):
            total += float(line.rpartition(" ")[2])
    return total


@pytest.mark.parametrize("stage", [("0", "shadow", [50])], indirect=True)
def test_shadow_mirrors_to_the_candidate_and_users_see_only_stable(stage: Stage) -> None:
    start(stage)

    async def burst() -> list[Sent]:
        async with aiohttp.ClientSession() as http:
            return [await send_one(http, stage.router, stage.keys, t) for t in TENANTS * 5]

    sent = asyncio.run(burst())

    assert {(s.status, s.version) for s in sent} == {(200, "v1")}
    eventually(lambda: _candidate_served(stage) >= 10, timeout=10, what="mirrored requests")
    mirrored = _candidate_served(stage)
    assert 15 <= mirrored <= 45  # about half of 60 (binomial, p = 0.5), one copy per request
    print(f"shadow: {len(sent)} requests, {mirrored:.0f} mirrored to the candidate")


async def stream_session(
    http: aiohttp.ClientSession, stage: Stage, tenant: str, session: str
) -> Sent:
    at = time.time()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 6,
            "stream": True}  # fmt: skip
    headers = {"Authorization": f"Bearer {stage.keys[tenant]}", "X-Session-Id": session}
    async with http.post(
        f"{stage.router.base_url}/v1/chat/completions", json=body, headers=headers
    ) as resp:
        text = await resp.text()
        assert text.rstrip().endswith("data: [DONE]"), text[-200:]
        return Sent(tenant, at, resp.status, resp.headers.get("x-switchyard-version", ""))


@pytest.mark.parametrize("stage", [("0", "ab", [50])], indirect=True)
def test_a_sticky_header_keeps_each_session_on_one_version_and_itl_is_recorded(
    stage: Stage,
) -> None:
    start(stage)
    sessions = [f"session-{i}" for i in range(16)]

    async def go() -> list[tuple[str, Sent]]:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
            return [
                (session, await stream_session(http, stage, TENANTS[n % len(TENANTS)], session))
                for n in range(3)  # each session from three different tenants
                for session in sessions
            ]

    sent = asyncio.run(go())

    assert {s.status for _, s in sent} == {200}
    versions: dict[str, set[str]] = {}
    for session, one in sent:
        versions.setdefault(session, set()).add(one.version)
    assert all(len(seen) == 1 for seen in versions.values()), versions
    assert {v for seen in versions.values() for v in seen} == {"v1", "v2"}
    # The router measured the gaps between streamed chunks per version (the ITL gate's input).
    namespace = contract.namespace_of(stage.prefix)

    def itl_samples() -> dict[str, int]:
        now = time.time()
        totals = read_window(
            stage.client, namespace=namespace, model=MODEL, versions=["v1", "v2"],
            since=now - 60, until=now,
        )  # fmt: skip
        return {label: sum(stats.itl_counts) for label, stats in totals.items()}

    eventually(lambda: min(itl_samples().values()) >= 5, timeout=10, what="ITL samples")
    print(f"sticky header: {len(sessions)} sessions x 3 tenants; ITL samples {itl_samples()}")
