"""Gate math (pure functions): the normal CDF, the two-proportion test, histogram quantiles,
Mann-Whitney on histograms, and the cost ratio."""

from __future__ import annotations

import math
import random

import pytest

from apps.rollouts import gates
from runtime.telemetry.versions import ITL_BOUNDS_MS, TTFT_BOUNDS_MS, ttft_bucket

pytestmark = pytest.mark.unit


def test_normal_cdf_matches_known_values() -> None:
    assert gates.normal_cdf(0.0) == pytest.approx(0.5)
    assert gates.normal_cdf(1.959964) == pytest.approx(0.975, abs=1e-6)
    assert gates.normal_cdf(-1.644854) == pytest.approx(0.05, abs=1e-6)


def error_gate(**kwargs: int) -> gates.GateResult:
    return gates.error_rate_gate(max_delta=0.01, min_samples=100, **kwargs)  # type: ignore[arg-type]


def test_error_gate_waits_for_the_minimum_sample() -> None:
    result = error_gate(
        stable_requests=1000, stable_errors=0, candidate_requests=99, candidate_errors=99
    )
    assert result.decision == "wait"


def test_error_gate_fails_a_clearly_worse_candidate_with_the_evidence() -> None:
    result = error_gate(
        stable_requests=1000, stable_errors=5, candidate_requests=200, candidate_errors=30
    )
    assert result.decision == "fail"
    assert result.numbers["candidate_rate"] == pytest.approx(0.15)
    assert result.numbers["p_value"] < 0.001
    assert "two-proportion" in result.test


def test_error_gate_passes_equal_rates_and_noise_within_the_margin() -> None:
    same = error_gate(
        stable_requests=1000, stable_errors=10, candidate_requests=500, candidate_errors=5
    )
    assert same.decision == "pass"
    # 2 % vs 1 %: above the 1-point margin only by chance at this size -> not significant.
    noisy = error_gate(
        stable_requests=300, stable_errors=3, candidate_requests=100, candidate_errors=2
    )
    assert noisy.decision == "pass"


def test_error_gate_with_no_errors_anywhere_passes_and_all_errors_fails() -> None:
    clean = error_gate(
        stable_requests=100, stable_errors=0, candidate_requests=100, candidate_errors=0
    )
    assert clean.decision == "pass"
    broken = error_gate(
        stable_requests=100, stable_errors=0, candidate_requests=100, candidate_errors=100
    )
    assert broken.decision == "fail"


def histogram(values_ms: list[float]) -> list[int]:
    counts = [0] * (len(TTFT_BOUNDS_MS) + 1)
    for value in values_ms:
        counts[ttft_bucket(value)] += 1
    return counts


def test_histogram_quantile_is_within_the_right_bucket() -> None:
    rng = random.Random(1)
    values = [rng.uniform(0, 1000) for _ in range(5000)]
    p95 = gates.histogram_quantile(TTFT_BOUNDS_MS, histogram(values), 0.95)
    assert 900 <= p95 <= 1000
    assert math.isnan(gates.histogram_quantile(TTFT_BOUNDS_MS, [0] * 5, 0.95))


def test_mann_whitney_sees_a_shift_and_not_identical_samples() -> None:
    rng = random.Random(2)
    base = histogram([rng.lognormvariate(4.5, 0.3) for _ in range(400)])
    same = histogram([rng.lognormvariate(4.5, 0.3) for _ in range(400)])
    slow = histogram([rng.lognormvariate(5.2, 0.3) for _ in range(400)])
    z_slow, p_slow = gates.mann_whitney_greater(base, slow)
    assert z_slow > 5
    assert p_slow < 1e-6
    _, p_same = gates.mann_whitney_greater(base, same)
    assert p_same > 0.01
    assert gates.mann_whitney_greater(base, [0] * len(base)) == (0.0, 1.0)


def test_latency_gate_fails_only_a_slower_candidate() -> None:
    rng = random.Random(3)
    stable = histogram([rng.lognormvariate(4.5, 0.3) for _ in range(400)])
    slow = histogram([rng.lognormvariate(5.2, 0.3) for _ in range(400)])
    fast = histogram([rng.lognormvariate(4.3, 0.3) for _ in range(400)])

    def gate(candidate: list[int]) -> gates.GateResult:
        return gates.latency_gate(
            name="ttft_p95", bounds=TTFT_BOUNDS_MS, stable=stable, candidate=candidate,
            max_ratio=1.2, min_samples=100,
        )  # fmt: skip

    failed = gate(slow)
    assert failed.decision == "fail"
    assert failed.numbers["ratio"] > 1.5
    assert gate(fast).decision == "pass"
    assert gate(histogram([100.0] * 50)).decision == "wait"


def test_cost_gate_fails_a_candidate_twice_as_expensive_per_token() -> None:
    stable = gates.cost_per_1k(
        prompt_tokens=1000, completion_tokens=1000, input_per_1k=0.5, output_per_1k=1.5
    )
    candidate = gates.cost_per_1k(
        prompt_tokens=1000, completion_tokens=1000, input_per_1k=1.0, output_per_1k=3.0
    )
    assert (stable, candidate) == (1.0, 2.0)

    def gate(stable_cost: float | None, candidate_cost: float | None) -> gates.GateResult:
        return gates.cost_gate(
            stable_cost_per_1k=stable_cost, candidate_cost_per_1k=candidate_cost,
            stable_requests=500, candidate_requests=500, max_ratio=1.1, min_samples=100,
        )  # fmt: skip

    assert gate(stable, candidate).decision == "fail"
    assert gate(stable, 1.05).decision == "pass"
    assert gate(None, candidate).decision == "pass"  # unpriced: recorded, not gating
    assert gate(0.0, 0.0).decision == "pass"
    assert (
        gates.cost_per_1k(prompt_tokens=0, completion_tokens=0, input_per_1k=1, output_per_1k=1)
        is None
    )


def test_overall_decision() -> None:
    def result(decision: str) -> gates.GateResult:
        return gates.GateResult("g", decision, "t")

    assert gates.overall([result("pass"), result("wait"), result("fail")]) == "fail"
    assert gates.overall([result("pass"), result("wait")]) == "wait"
    assert gates.overall([result("pass"), result("pass")]) == "pass"


def test_a_latency_gate_over_optional_samples_is_not_applicable_once_requests_suffice() -> None:
    empty = [0] * (len(ITL_BOUNDS_MS) + 1)
    kwargs = {"name": "itl_p95", "bounds": ITL_BOUNDS_MS, "stable": empty, "candidate": empty,
              "max_ratio": 1.2, "min_samples": 50}  # fmt: skip
    assert gates.latency_gate(**kwargs).decision == "wait"  # type: ignore[arg-type]
    assert gates.latency_gate(**kwargs, requests=(49, 500)).decision == "wait"  # type: ignore[arg-type]
    na = gates.latency_gate(**kwargs, requests=(50, 50))  # type: ignore[arg-type]
    assert (na.decision, na.passed, na.numbers["applicable"]) == ("pass", True, False)


def test_gate_results_share_one_evidence_shape() -> None:
    errors = error_gate(
        stable_requests=1000, stable_errors=10, candidate_requests=500, candidate_errors=100
    )
    assert (errors.stable, errors.candidate, errors.threshold) == (0.01, 0.2, 0.01)
    assert errors.ratio == pytest.approx(20.0)
    assert errors.as_dict()["passed"] is False
    cost = gates.cost_gate(
        stable_cost_per_1k=1.0, candidate_cost_per_1k=1.05, stable_requests=9,
        candidate_requests=9, max_ratio=1.1, min_samples=1,
    )  # fmt: skip
    assert (cost.passed, cost.ratio, cost.stable, cost.candidate) == (True, 1.05, 1.0, 1.05)
    waiting = gates.cost_gate(
        stable_cost_per_1k=None, candidate_cost_per_1k=None, stable_requests=0,
        candidate_requests=0, max_ratio=1.1, min_samples=1,
    )  # fmt: skip
    assert waiting.as_dict()["passed"] is None
    assert set(errors.as_dict()) == set(cost.as_dict()) == set(waiting.as_dict())


def test_the_itl_gate_fails_a_candidate_that_misses_the_class_objective_the_stable_meets() -> None:
    """Issue #33: the ITL gate is judged against the request classes' ITL objective too."""
    bounds = ITL_BOUNDS_MS

    def itl(ms: float, n: int = 400) -> list[int]:
        counts = [0] * (len(bounds) + 1)
        counts[next(i for i, b in enumerate(bounds) if ms <= b)] += n
        return counts

    def gate(candidate: list[int], objective: float | None) -> gates.GateResult:
        return gates.latency_gate(
            name="itl_p95", bounds=bounds, stable=itl(18.0), candidate=candidate,
            max_ratio=2.0, min_samples=100, objective=objective,
        )  # fmt: skip

    slower = itl(28.0)  # within the 2x ratio of the stable's ~20 ms
    assert gate(slower, objective=None).decision == "pass"
    assert gate(slower, objective=50.0).decision == "pass"  # both within the objective
    missed = gate(slower, objective=25.0)  # the stable meets 25 ms, the candidate does not
    assert missed.decision == "fail"
    assert missed.numbers["objective_ms"] == 25.0
    assert gate(slower, objective=10.0).decision == "pass"  # neither meets it: not the change
