"""The batch-on-idle-capacity bench's pure parts: the world it publishes (the batch tenant's
key marked ``batch``, so its lines get the batch price), the interactive-only schedule, the
batch's lines and the SLO share."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.batch_idle import BATCH_TENANT, _keys, batch_lines, interactive_plan, slo_share, world
from bench.loadgen import Result
from bench.scenario import load
from bench.workload import Planned

pytestmark = pytest.mark.unit

CONTENTION = Path(__file__).resolve().parents[2] / "bench/scenarios/contention.toml"


def test_the_world_marks_only_the_batch_tenants_key_batch() -> None:
    scenario = load(CONTENTION)
    keys = _keys(scenario)
    snapshot = world(scenario, ["http://127.0.0.1:1", "http://127.0.0.1:2"], keys).snapshot()
    flagged = {key.tenant for key in snapshot.api_keys.values() if key.batch}
    assert flagged == {BATCH_TENANT}
    assert snapshot.tenants[BATCH_TENANT].classes == ("batch",)
    assert snapshot.tenants["acme"].classes == ("interactive",)
    assert len(snapshot.endpoints) == 2


def test_the_schedules() -> None:
    scenario = load(CONTENTION)
    plan = interactive_plan(scenario, 5.0)
    assert plan.requests
    assert {p.klass for p in plan.requests} == {"interactive"}
    lines = batch_lines(scenario, 7)
    assert len(lines) == 7
    assert all(json.loads(body)["max_tokens"] >= 1 for body in lines)
    assert batch_lines(scenario, 7) == lines  # the same batch every run


def test_slo_share_counts_errors_as_misses() -> None:
    planned = Planned(index=0, at=0.0, tenant="t", klass="interactive", prompt_tokens=1,
                      max_tokens=1, stream=False)  # fmt: skip
    fast, slow = Result(planned, ttft=0.2), Result(planned, ttft=2.0)
    broken = Result(planned, ttft=0.1, error="timeout")
    assert slo_share([fast, slow, broken, fast], 1.0) == 0.5
