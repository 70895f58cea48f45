"""The rollouts page's gate evidence, stable beside candidate: generic over the gate entries
(a gate the evaluator adds later, such as ITL, shows without a change), and on the page."""

from __future__ import annotations

import asyncio

import pytest
import redis
from django.contrib.auth.models import User
from django.test import Client
from fixtures.router import redis_url

from apps.models.services import endpoint_register, endpoint_set_state, pool_create
from apps.rollouts import gates
from apps.rollouts.evaluate import gate_results
from apps.rollouts.models import Rollout
from apps.rollouts.transitions import rollout_rollback, rollout_start, rollout_warmed
from apps.scaling.models import ScalingDecision
from frontend.control_feed import control_document
from frontend.rollout_panels import evidence_rows
from runtime.telemetry.versions import TTFT_BOUNDS_MS, VersionStats, WindowStats

pytestmark = pytest.mark.integration


def _evidence(rollout: Rollout) -> dict[str, object]:
    stable, candidate = WindowStats(), WindowStats()
    stable.add({b"n": b"400", b"err": b"2", b"ttft:5": b"400", b"pt": b"4000", b"ct": b"8000"})
    candidate.add({b"n": b"300", b"err": b"30", b"ttft:9": b"300", b"pt": b"3000", b"ct": b"6000"})
    results = gate_results(rollout, stable, candidate)
    itl = gates.latency_gate(  # a gate this page has never heard of
        name="itl_p95", bounds=TTFT_BOUNDS_MS, stable=[0, 300, 0], candidate=[0, 0, 300],
        max_ratio=1.2, min_samples=100,
    )  # fmt: skip
    return {
        "decision": "fail",
        "step": 0,
        "stable": stable.summary(),
        "candidate": candidate.summary(),
        "gates": [r.as_dict() for r in [*results, itl]],
    }


@pytest.mark.unit
def test_evidence_rows_pair_stable_and_candidate_for_any_gate() -> None:
    itl = gates.latency_gate(
        name="itl_p95", bounds=(5.0, 10.0), stable=[100, 0, 0], candidate=[0, 100, 0],
        max_ratio=1.2, min_samples=10,
    )  # fmt: skip
    waiting = gates.cost_gate(
        stable_cost_per_1k=None, candidate_cost_per_1k=None, stable_requests=1,
        candidate_requests=1, max_ratio=1.1, min_samples=10,
    )  # fmt: skip
    groups = evidence_rows({"gates": [itl.as_dict(), waiting.as_dict()]})
    assert [(g["gate"], g["decision"]) for g in groups] == [("itl_p95", "fail"), ("cost", "wait")]
    metrics = {row["metric"]: (row["stable"], row["candidate"]) for row in groups[0]["rows"]}
    assert metrics["samples"] == ("100", "100")
    assert metrics["p95_ms"] == ("4.75", "9.75")
    assert "max_ratio 1.2" in groups[0]["notes"]
    assert groups[1]["rows"] == [{"metric": "cost_per_1k", "stable": "—", "candidate": "—"}]
    assert evidence_rows(None) == []
    assert evidence_rows({}) == []


@pytest.mark.integration
def test_rollouts_page_shows_latest_evidence_side_by_side(
    people: dict[str, User],
    rollout: Rollout,
) -> None:
    pool = pool_create(actor=None, name="ev-cpu", hardware_tier="cpu", cost_per_replica_hour=1)
    for number, version in enumerate((rollout.stable_version, rollout.candidate_version)):
        endpoint = endpoint_register(
            actor=None, pool=pool, version=version, base_url=f"http://127.0.0.1:{9200 + number}",
            capacity=4,
        )  # fmt: skip
        endpoint_set_state(actor=None, endpoint=endpoint, state="ready")
    running = rollout_warmed(actor=None, rollout=rollout_start(actor=None, rollout=rollout))
    rollout_rollback(actor=None, rollout=running, reason="Gate failed: error_rate.",
                     evidence=_evidence(running))  # fmt: skip
    client = Client()
    client.force_login(people["staff"])
    page = client.get("/dashboard/rollouts/").content.decode()
    assert f'id="rollout-{rollout.pk}" data-state="rolled_back"' in page
    for gate in ("window totals", "error_rate", "ttft_p95", "cost", "itl_p95"):
        assert f"<td>{gate}" in page, gate
    assert "<td>requests</td><td>400</td><td>300</td>" in page  # the window's sample counts
    assert "<td>rate</td><td>0.005</td><td>0.1</td>" in page  # error rates side by side
    assert "Gate failed: error_rate." in page  # the event log


@pytest.mark.integration
def test_scaling_page_lists_pools_replicas_and_decisions(people: dict[str, User]) -> None:
    pool = pool_create(actor=None, name="sc-cpu", hardware_tier="cpu", cost_per_replica_hour=1,
                       max_replicas=4)  # fmt: skip
    ScalingDecision.objects.create(
        pool=pool, policy="cpu", actuator="local", action="out", current=1, desired=3,
        reason="queue wait p95 2.1 s above the 1 s SLO", signals={"queued": {"0": 7}},
    )  # fmt: skip
    client = Client()
    client.force_login(people["staff"])
    page = client.get("/dashboard/scaling/").content.decode()
    assert 'id="pool-sc-cpu"' in page
    assert "<td>1 → 3</td><td>queue wait p95 2.1 s above the 1 s SLO</td>" in page
    assert "queued {0: 7}" in page
    assert 'id="scaling-data"' in page  # the chart's first points, then the staff feed
    assert '<strong class="serving">0</strong>' in page


async def _routers_counted(namespace: str, requests: dict[str, int]) -> None:
    """What routers write: per-version counters in Redis (the evaluator's own source)."""
    stats = VersionStats(redis_url(), namespace=namespace)
    await stats.start()
    try:
        for version, n in requests.items():
            for i in range(n):
                stats.record(
                    model="tiny-llama", version=version, status=500 if i % 10 == 0 else 200,
                    outcome="ok", ttft_ms=40.0, prompt_tokens=10, completion_tokens=20,
                )  # fmt: skip
        assert await stats.flush() > 0
    finally:
        await stats.stop()


@pytest.mark.integration
def test_gate_preview_reads_the_current_window_from_the_routers_counters(
    people: dict[str, User], rollout: Rollout, namespace: str
) -> None:
    pool = pool_create(actor=None, name="pv-cpu", hardware_tier="cpu", cost_per_replica_hour=1)
    for number, version in enumerate((rollout.stable_version, rollout.candidate_version)):
        endpoint = endpoint_register(
            actor=None, pool=pool, version=version, base_url=f"http://127.0.0.1:{9300 + number}",
            capacity=4,
        )  # fmt: skip
        endpoint_set_state(actor=None, endpoint=endpoint, state="ready")
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
    try:
        pending = control_document(client, namespace)["rollouts"][0]
        assert pending["preview"] == []  # a draft holds no traffic
        rollout_warmed(actor=None, rollout=rollout_start(actor=None, rollout=rollout))
        asyncio.run(_routers_counted(namespace, {"v1": 30, "v2": 20}))
        (view,) = control_document(client, namespace)["rollouts"]
    finally:
        client.delete(*client.keys(f"{namespace}:vstats:*"))
        client.close()
    assert view["preview_decision"] == "wait"  # 200 samples needed, 20 seen
    groups = {g["gate"]: g for g in view["preview"]}
    assert set(groups) == {"window totals", "error_rate", "ttft_p95", "itl_p95", "cost"}
    totals = {r["metric"]: (r["stable"], r["candidate"]) for r in groups["window totals"]["rows"]}
    assert totals["requests"] == ("30", "20")
    assert totals["errors"] == ("3", "2")
    assert groups["error_rate"]["decision"] == "wait"
