"""Paired draws (a phase's ``arrivals_from``): the flood phase replays the baseline's
well-behaved requests, the flooder draws its own."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from bench.scenario import ScenarioError, load, override, parse
from bench.workload import PhasePlan, drawn_from, plan_phase

pytestmark = pytest.mark.unit

CONTENTION = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "contention.toml"
WELL_BEHAVED = ("acme", "globex", "initech")


def _doc() -> dict[str, Any]:
    with CONTENTION.open("rb") as handle:
        return tomllib.load(handle)


def _schedule(plan: PhasePlan, tenant: str) -> list[tuple[float, str, int, int, bool]]:
    return [(p.at, p.klass, p.prompt_tokens, p.max_tokens, p.stream)
            for p in plan.requests if p.tenant == tenant]  # fmt: skip


def _plans(doc: dict[str, Any]) -> tuple[PhasePlan, PhasePlan]:
    scenario = parse(doc)
    base, flood = (plan_phase(scenario, p, duration_s=20.0, max_requests=100_000)
                   for p in scenario.phases)  # fmt: skip
    return base, flood


def test_the_flood_phase_replays_the_baselines_well_behaved_requests() -> None:
    scenario = load(CONTENTION)
    assert scenario.phase("flood").arrivals_from == "baseline"
    assert drawn_from(scenario, scenario.phase("flood")) == {
        "acme": "baseline", "globex": "baseline", "initech": "baseline", "floodco": "flood",
    }  # fmt: skip
    base, flood = _plans(_doc())
    for tenant in WELL_BEHAVED:
        assert _schedule(base, tenant)
        assert _schedule(flood, tenant) == _schedule(base, tenant)
    # the flooder keeps its own, larger draw
    assert len(_schedule(flood, "floodco")) > 10 * len(_schedule(base, "floodco"))


def test_without_pairing_each_phase_draws_its_own() -> None:
    doc = _doc()
    del doc["phases"][1]["arrivals_from"]
    base, flood = _plans(doc)
    for tenant in WELL_BEHAVED:
        assert _schedule(flood, tenant) != _schedule(base, tenant)


def test_a_tenant_whose_rate_changes_keeps_its_own_draw() -> None:
    # the whole flood phase at another base load: nobody's rate matches the baseline's
    base, flood = _plans(override(_doc(), "phases.1.load_factor", 0.7))
    for tenant in (*WELL_BEHAVED, "floodco"):
        assert _schedule(flood, tenant) != _schedule(base, tenant)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nope", "no phase named 'nope'"),
        ("flood", "must be another phase"),  # itself
    ],
)
def test_arrivals_from_must_name_another_phase(value: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=rf"phases\[1\]\.arrivals_from: .*{message}"):
        parse(override(_doc(), "phases.1.arrivals_from", value))


def test_arrivals_from_must_not_chain() -> None:
    doc = override(_doc(), "phases.0.arrivals_from", "flood")
    with pytest.raises(ScenarioError, match="must be another phase drawing its own"):
        parse(doc)
