"""The embeddings benchmark's analysis (bench/embeddings.py): percentiles, the throughput at the
p95 budget, and the scenario file's shape. The benchmark itself runs the real worker for
minutes; it is run by hand (README, Performance)."""

from __future__ import annotations

import random
import tomllib
from pathlib import Path

import pytest

from bench.embeddings import percentile, texts, throughput_at_p95

pytestmark = pytest.mark.unit
SCENARIO = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "embeddings.toml"


def test_percentile_is_the_nearest_rank():
    assert percentile([], 0.95) is None
    assert percentile([5.0], 0.95) == 5.0
    assert percentile([float(i) for i in range(1, 101)], 0.95) == 95.0


def test_throughput_at_p95_takes_the_best_phase_within_budget_without_errors():
    phases = [
        {"achieved_rps": 10.0, "p95_ms": 100.0, "errors": 0},
        {"achieved_rps": 40.0, "p95_ms": 240.0, "errors": 0},
        {"achieved_rps": 60.0, "p95_ms": 900.0, "errors": 0},  # over budget
        {"achieved_rps": 50.0, "p95_ms": 200.0, "errors": 3},  # errors do not count
    ]
    assert throughput_at_p95(phases, 250.0) == 40.0
    assert throughput_at_p95(phases[2:], 250.0) == 0.0


def test_scenario_has_both_configs_sizes_and_a_sweep():
    scenario = tomllib.loads(SCENARIO.read_text())
    assert {c["name"] for c in scenario["configs"]} == {"batching-off", "batching-on"}
    assert {"smoke", "full"} <= set(scenario["sizes"])
    assert len(scenario["sweep"]["max_wait_ms"]) >= 3
    inputs = texts(scenario, 50, random.Random(1))
    lengths = scenario["lengths"]
    assert all(lengths["min"] <= len(t.split()) <= lengths["max"] for t in inputs)
