"""The evaluator reads the routers' per-version telemetry from Redis (written by the router's
own ``VersionStats`` flusher) and advances, promotes or rolls back, with the evidence."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta
from typing import Any

import pytest
from django.conf import settings as django_settings

from apps.billing.services import price_set
from apps.models.models import Route
from apps.rollouts.evaluate import rollout_evaluate, rollouts_evaluate_running
from apps.rollouts.models import Rollout, RolloutEvent
from apps.rollouts.services import rollout_create
from apps.rollouts.transitions import rollout_start
from apps.rollouts.warmup import rollout_warm_up
from runtime.telemetry.versions import VersionStats, itl_bucket, read_window

pytestmark = [pytest.mark.db, pytest.mark.django_db]


@pytest.fixture
def namespace(settings: Any, key_prefix: str) -> str:
    """The test's own Redis namespace (its keys deleted afterwards) and snapshot prefix."""
    settings.SNAPSHOT_REDIS_PREFIX = f"{key_prefix}:snapshot"
    return key_prefix


def send(namespace: str, version: str, *, n: int, errors: int = 0, ttft_ms: float = 80.0,
         model: str = "tiny-llama", itl_ms: tuple[float, ...] = ()) -> None:  # fmt: skip
    """What a router records for ``n`` requests to ``version``, flushed to Redis."""

    async def go() -> None:
        stats = VersionStats(django_settings.REDIS_URL, namespace=namespace, interval_s=60)
        await stats.start()
        for i in range(n):
            failed = i < errors
            stats.record(
                model=model, version=version, status=502 if failed else 200,
                outcome="upstream_error" if failed else "ok",
                ttft_ms=None if failed else ttft_ms, prompt_tokens=20, completion_tokens=30,
                itl_ms=() if failed else itl_ms,
            )  # fmt: skip
        await stats.stop()  # flushes

    asyncio.run(go())


@pytest.fixture
def rollout(llm, stable, candidate, ready_endpoints) -> Rollout:
    ready_endpoints()
    made = rollout_create(
        actor=None, model=llm, stable_version=stable, candidate_version=candidate,
        mode="canary", steps=[10, 50, 100], min_samples=50, step_window_s=60,
    )  # fmt: skip
    rollout_start(actor=None, rollout=made)
    return rollout_warm_up(actor=None, rollout=made)


def age_step(rollout: Rollout, seconds: float) -> None:
    Rollout.objects.filter(pk=rollout.pk).update(
        step_started_at=rollout.step_started_at - timedelta(seconds=seconds)
    )
    rollout.refresh_from_db()


def test_the_router_flush_lands_in_the_window(namespace, redis_client):
    send(namespace, "v1", n=7, errors=2, ttft_ms=120)
    now = time.time()
    totals = read_window(
        redis_client, namespace=namespace, model="tiny-llama", versions=["v1", "v2"],
        since=now - 10, until=now,
    )  # fmt: skip
    v1 = totals["v1"]
    assert (v1.requests, v1.errors, v1.errors_by_kind) == (7, 2, {"upstream_error": 2})
    assert (v1.prompt_tokens, v1.completion_tokens, sum(v1.ttft_counts)) == (140, 210, 5)
    assert totals["v2"].requests == 0


def test_an_erroring_candidate_is_rolled_back_with_the_evidence(namespace, redis_client, rollout):
    send(namespace, "v1", n=200)
    send(namespace, "v2", n=60, errors=20)

    evaluation = rollout_evaluate(rollout=rollout, client=redis_client)

    assert evaluation.action == "rollback"
    rollout.refresh_from_db()
    assert rollout.state == "rolled_back"
    assert {s.version.label: s.weight for s in Route.objects.get().splits.all()} == {"v1": 100}
    event = RolloutEvent.objects.get(rollout=rollout, kind="rollback")
    assert event.reason == "Gate failed: error_rate."
    gate = event.data["evidence"]["gates"][0]
    assert (gate["gate"], gate["decision"]) == ("error_rate", "fail")
    assert gate["numbers"]["candidate"] == {"requests": 60, "errors": 20}
    assert gate["numbers"]["p_value"] < 0.001


def test_a_slow_candidate_is_rolled_back(namespace, redis_client, rollout):
    send(namespace, "v1", n=200, ttft_ms=80)
    send(namespace, "v2", n=60, ttft_ms=400)
    assert rollout_evaluate(rollout=rollout, client=redis_client).action == "rollback"
    assert RolloutEvent.objects.get(rollout=rollout, kind="rollback").reason == (
        "Gate failed: ttft_p95."
    )


def test_the_inter_token_gaps_land_in_the_window(namespace, redis_client):
    send(namespace, "v1", n=3, itl_ms=(4.0, 12.0, 12.0))
    now = time.time()
    v1 = read_window(
        redis_client,
        namespace=namespace,
        model="tiny-llama",
        versions=["v1"],
        since=now - 10,
        until=now,
    )["v1"]
    assert sum(v1.itl_counts) == 9
    assert v1.itl_counts[itl_bucket(4.0)] == 3
    assert v1.itl_counts[itl_bucket(12.0)] == 6
    assert v1.summary()["itl_samples"] == 9


def test_a_candidate_with_slow_inter_token_latency_is_rolled_back(namespace, redis_client, rollout):
    send(namespace, "v1", n=200, itl_ms=(10.0,) * 8)
    send(namespace, "v2", n=60, itl_ms=(40.0,) * 8)  # TTFT, errors and cost as stable's

    assert rollout_evaluate(rollout=rollout, client=redis_client).action == "rollback"

    event = RolloutEvent.objects.get(rollout=rollout, kind="rollback")
    assert event.reason == "Gate failed: itl_p95."
    gates = {g["gate"]: g for g in event.data["evidence"]["gates"]}
    assert list(gates) == ["error_rate", "ttft_p95", "itl_p95", "cost"]
    itl = gates["itl_p95"]
    assert (itl["passed"], itl["threshold"], itl["unit"]) == (False, 1.2, "ms")
    assert itl["stable"] <= 10.0 < 30.0 <= itl["candidate"] <= 45.0
    assert itl["ratio"] > 2.5
    assert itl["p_value"] < 0.001
    # One shape for every gate, so a dashboard can show any of them.
    shape = {"gate", "decision", "test", "numbers", "stable", "candidate", "ratio", "p_value",
             "threshold", "unit", "passed"}  # fmt: skip
    assert all(set(g) == shape for g in gates.values())
    assert gates["ttft_p95"]["passed"] is True


def test_unary_traffic_leaves_the_itl_gate_not_applicable(namespace, redis_client, rollout):
    send(namespace, "v1", n=200)
    send(namespace, "v2", n=60)
    age_step(rollout, 61)
    evaluation = rollout_evaluate(rollout=rollout, client=redis_client)
    assert evaluation.action == "advance"
    itl = next(g for g in evaluation.evidence["gates"] if g["gate"] == "itl_p95")
    assert (itl["decision"], itl["numbers"]["applicable"]) == ("pass", False)


def test_a_candidate_twice_as_expensive_is_rolled_back(namespace, redis_client, rollout):
    price_set(actor=None, version=rollout.stable_version, hardware_tier="cpu",
              input_per_1k="1", output_per_1k="2")  # fmt: skip
    price_set(actor=None, version=rollout.candidate_version, hardware_tier="cpu",
              input_per_1k="2", output_per_1k="4")  # fmt: skip
    send(namespace, "v1", n=200)
    send(namespace, "v2", n=60)
    assert rollout_evaluate(rollout=rollout, client=redis_client).action == "rollback"
    event = RolloutEvent.objects.get(rollout=rollout, kind="rollback")
    cost = next(g for g in event.data["evidence"]["gates"] if g["gate"] == "cost")
    assert cost["numbers"]["ratio"] == pytest.approx(2.0)


def test_too_few_samples_waits_and_writes_nothing(namespace, redis_client, rollout):
    send(namespace, "v1", n=200)
    send(namespace, "v2", n=10, errors=10)
    age_step(rollout, 120)
    assert rollout_evaluate(rollout=rollout, client=redis_client).decision == "wait"
    assert rollout.state == "running"
    assert not RolloutEvent.objects.filter(rollout=rollout, kind="rollback").exists()


def test_a_healthy_candidate_advances_after_the_step_time_then_promotes(
    namespace, redis_client, rollout
):
    send(namespace, "v1", n=200)
    send(namespace, "v2", n=60)
    assert rollout_evaluate(rollout=rollout, client=redis_client).action == "none"  # step too young

    age_step(rollout, 61)
    assert rollouts_evaluate_running() == {rollout.pk: "advance"}
    rollout.refresh_from_db()
    assert rollout.current_step == 1
    advance = RolloutEvent.objects.get(rollout=rollout, kind="advance")
    assert advance.data["evidence"]["decision"] == "pass"

    age_step(rollout, 61)
    send(namespace, "v2", n=60)  # the new step's window
    assert rollouts_evaluate_running() == {rollout.pk: "promote"}
    rollout.refresh_from_db()
    assert rollout.state == "promoted"


def test_a_paused_rollout_is_not_evaluated(namespace, redis_client, rollout):
    Rollout.objects.filter(pk=rollout.pk).update(state="paused")
    send(namespace, "v1", n=200)
    send(namespace, "v2", n=60, errors=60)
    assert rollouts_evaluate_running() == {}


def test_a_failing_shadow_candidate_is_rolled_back_and_a_passing_one_waits(
    namespace, redis_client, llm, stable, candidate, ready_endpoints
):
    ready_endpoints()
    shadow = rollout_create(
        actor=None, model=llm, stable_version=stable, candidate_version=candidate,
        mode="shadow", steps=[20], min_samples=50, step_window_s=60,
    )  # fmt: skip
    rollout_start(actor=None, rollout=shadow)
    rollout_warm_up(actor=None, rollout=shadow)
    send(namespace, "v1", n=200)
    send(namespace, "v2", n=60)
    age_step(shadow, 61)
    assert rollout_evaluate(rollout=shadow, client=redis_client).action == "none"  # promote by hand
    send(namespace, "v2", n=60, errors=60)
    assert rollout_evaluate(rollout=shadow, client=redis_client).action == "rollback"
    shadow.refresh_from_db()
    assert shadow.state == "rolled_back"
