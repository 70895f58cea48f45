"""Gate math: candidate versus stable over the same window (pure functions, no I/O).

Each gate returns a :class:`GateResult`: ``"pass"``, ``"fail"`` or ``"wait"`` (too few
samples), with the numbers and the test behind it (recorded in the ``RolloutEvent``). Every
gate's evidence has the same top-level shape (``as_dict``): ``stable`` and ``candidate`` (the
compared values), ``ratio`` (candidate / stable; the error gate also has ``delta``),
``p_value``, ``threshold``, ``unit``, ``passed`` (None while waiting), plus the gate's details
in ``numbers``.

- error rate: one-sided two-proportion z-test of ``p_candidate - p_stable > max_delta``;
- TTFT p95 and ITL p95 (inter-token latency): the ratio of the histograms' p95s against a
  threshold, and a one-sided Mann-Whitney U test (normal approximation, tie-corrected, on the
  histogram buckets) that the candidate is slower; the gate fails only when both say so;
- cost per 1k tokens: the ratio of the two versions' cost per 1k tokens against a threshold.

The normal CDF comes from ``math.erf`` (no scipy).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

ALPHA = 0.05


@dataclass(frozen=True, slots=True)
class GateResult:
    gate: str
    decision: str  # "pass" | "fail" | "wait"
    test: str
    numbers: dict[str, Any] = field(default_factory=dict)
    stable: float | None = None  # the compared value (rate, p95 ms, credits per 1k tokens)
    candidate: float | None = None
    ratio: float | str | None = None  # candidate / stable ("inf" when stable is 0)
    p_value: float | None = None
    threshold: float | None = None  # the largest ratio (or, for errors, delta) that passes
    unit: str = ""

    @property
    def passed(self) -> bool | None:
        return None if self.decision == "wait" else self.decision == "pass"

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "passed": self.passed}


def _ratio(candidate: float, stable: float) -> float | str | None:
    if math.isnan(candidate) or math.isnan(stable):
        return None
    if stable == 0:
        return 1.0 if candidate == 0 else "inf"
    return _finite(candidate / stable)


def normal_cdf(z: float) -> float:
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def error_rate_gate(
    *,
    stable_requests: int,
    stable_errors: int,
    candidate_requests: int,
    candidate_errors: int,
    max_delta: float,
    min_samples: int,
    alpha: float = ALPHA,
) -> GateResult:
    """Fail when the candidate's error rate exceeds stable's by more than ``max_delta`` with
    one-sided significance ``alpha`` (pooled two-proportion z-test, shifted by the margin)."""
    numbers: dict[str, Any] = {
        "stable": {"requests": stable_requests, "errors": stable_errors},
        "candidate": {"requests": candidate_requests, "errors": candidate_errors},
        "max_delta": max_delta,
        "min_samples": min_samples,
        "alpha": alpha,
    }
    test = "two-proportion z-test (one-sided, margin max_delta)"
    common: dict[str, Any] = {"threshold": max_delta, "unit": "error rate"}
    if min(stable_requests, candidate_requests) < min_samples:
        return GateResult("error_rate", "wait", test, numbers, **common)
    p_s = stable_errors / stable_requests
    p_c = candidate_errors / candidate_requests
    pooled = (stable_errors + candidate_errors) / (stable_requests + candidate_requests)
    se = math.sqrt(pooled * (1 - pooled) * (1 / stable_requests + 1 / candidate_requests))
    excess = p_c - p_s - max_delta
    if se == 0.0:
        p_value = 0.0 if excess > 0 else 1.0
        z = math.inf if excess > 0 else -math.inf
    else:
        z = excess / se
        p_value = 1.0 - normal_cdf(z)
    numbers.update(
        stable_rate=p_s, candidate_rate=p_c, z=_finite(z), p_value=p_value, delta=p_c - p_s
    )
    decision = "fail" if excess > 0 and p_value < alpha else "pass"
    numbers["delta"] = p_c - p_s
    return GateResult(
        "error_rate", decision, test, numbers, stable=p_s, candidate=p_c,
        ratio=_ratio(p_c, p_s), p_value=p_value, **common,
    )  # fmt: skip


def histogram_quantile(bounds: Sequence[float], counts: Sequence[int], q: float) -> float:
    """The ``q`` quantile of a histogram (bucket ``i`` holds values ``<= bounds[i]``, the last
    bucket is open); linear inside the bucket. NaN for an empty histogram."""
    total = sum(counts)
    if total == 0:
        return math.nan
    rank = q * total
    seen = 0.0
    for index, count in enumerate(counts):
        if count and seen + count >= rank:
            low = bounds[index - 1] if index > 0 else 0.0
            high = bounds[index] if index < len(bounds) else bounds[-1] * 2
            return low + (high - low) * (rank - seen) / count
        seen += count
    return bounds[-1] * 2


def mann_whitney_greater(stable: Sequence[int], candidate: Sequence[int]) -> tuple[float, float]:
    """One-sided Mann-Whitney U on two histograms over the same buckets: (z, p) for
    "the candidate's values are stochastically larger". Ties are whole buckets (midranks)."""
    n_s, n_c = sum(stable), sum(candidate)
    n = n_s + n_c
    if n_s == 0 or n_c == 0:
        return 0.0, 1.0
    rank_sum_c = 0.0
    below = 0
    tie_term = 0.0
    for count_s, count_c in zip(stable, candidate, strict=True):
        tied = count_s + count_c
        midrank = below + (tied + 1) / 2.0
        rank_sum_c += count_c * midrank
        tie_term += tied**3 - tied
        below += tied
    u_c = rank_sum_c - n_c * (n_c + 1) / 2.0
    mean = n_s * n_c / 2.0
    variance = n_s * n_c / 12.0 * ((n + 1) - tie_term / (n * (n - 1)))
    if variance <= 0:
        return 0.0, 1.0
    z = (u_c - mean) / math.sqrt(variance)
    return z, 1.0 - normal_cdf(z)


def latency_gate(
    *,
    name: str,
    bounds: Sequence[float],
    stable: Sequence[int],
    candidate: Sequence[int],
    max_ratio: float,
    min_samples: int,
    alpha: float = ALPHA,
    requests: tuple[int, int] | None = None,
    objective: float | None = None,
) -> GateResult:
    """Fail when candidate p95 / stable p95 exceeds ``max_ratio`` and Mann-Whitney says the
    candidate is slower at significance ``alpha``; with an ``objective`` (ms: the request
    classes' ITL objective), also when the candidate's p95 misses it while the stable
    version's meets it.

    ``requests`` (stable, candidate), for a metric only some requests have (ITL: streamed
    ones): once both versions have ``min_samples`` requests but too few samples, the gate
    passes as not applicable instead of holding the rollout forever."""
    numbers: dict[str, Any] = {
        "stable_samples": sum(stable),
        "candidate_samples": sum(candidate),
        "max_ratio": max_ratio,
        "min_samples": min_samples,
        "alpha": alpha,
    }
    test = "p95 ratio + Mann-Whitney U (one-sided, normal approximation)"
    common: dict[str, Any] = {"threshold": max_ratio, "unit": "ms"}
    if min(sum(stable), sum(candidate)) < min_samples:
        if requests is not None and min(requests) >= min_samples:
            numbers["applicable"] = False
            return GateResult(name, "pass", test + " (too few samples: n/a)", numbers, **common)
        return GateResult(name, "wait", test, numbers, **common)
    p95_s = histogram_quantile(bounds, stable, 0.95)
    p95_c = histogram_quantile(bounds, candidate, 0.95)
    ratio = p95_c / p95_s if p95_s > 0 else math.inf
    z, p_value = mann_whitney_greater(stable, candidate)
    numbers.update(
        stable_p95_ms=p95_s, candidate_p95_ms=p95_c, ratio=_finite(ratio), z=z, p_value=p_value
    )
    decision = "fail" if ratio > max_ratio and p_value < alpha else "pass"
    if objective is not None:
        numbers["objective_ms"] = objective
        if p95_c > objective >= p95_s:
            decision = "fail"
    return GateResult(
        name, decision, test, numbers, stable=p95_s, candidate=p95_c, ratio=_finite(ratio),
        p_value=p_value, **common,
    )  # fmt: skip


def cost_per_1k(
    *, prompt_tokens: int, completion_tokens: int, input_per_1k: float, output_per_1k: float
) -> float | None:
    tokens = prompt_tokens + completion_tokens
    if tokens == 0:
        return None
    credits = (prompt_tokens * input_per_1k + completion_tokens * output_per_1k) / 1000.0
    return 1000.0 * credits / tokens


def cost_gate(
    *,
    stable_cost_per_1k: float | None,
    candidate_cost_per_1k: float | None,
    stable_requests: int,
    candidate_requests: int,
    max_ratio: float,
    min_samples: int,
) -> GateResult:
    """Fail when the candidate's cost per 1k tokens is more than ``max_ratio`` times stable's.
    Passes (recorded as unpriced) when either version has no price."""
    numbers: dict[str, Any] = {
        "stable_cost_per_1k": stable_cost_per_1k,
        "candidate_cost_per_1k": candidate_cost_per_1k,
        "max_ratio": max_ratio,
        "min_samples": min_samples,
    }
    test = "cost per 1k tokens ratio"
    common: dict[str, Any] = {
        "threshold": max_ratio,
        "unit": "credits per 1k tokens",
        "stable": stable_cost_per_1k,
        "candidate": candidate_cost_per_1k,
    }
    if min(stable_requests, candidate_requests) < min_samples:
        return GateResult("cost", "wait", test, numbers, **common)
    if stable_cost_per_1k is None or candidate_cost_per_1k is None:
        return GateResult("cost", "pass", test + " (unpriced or no tokens)", numbers, **common)
    if stable_cost_per_1k == 0:
        ratio = math.inf if candidate_cost_per_1k > 0 else 1.0
    else:
        ratio = candidate_cost_per_1k / stable_cost_per_1k
    numbers["ratio"] = _finite(ratio)
    decision = "fail" if ratio > max_ratio else "pass"
    return GateResult("cost", decision, test, numbers, ratio=_finite(ratio), **common)


def overall(results: Sequence[GateResult]) -> str:
    """``fail`` if any gate fails, else ``wait`` if any waits, else ``pass``."""
    decisions = {result.decision for result in results}
    if "fail" in decisions:
        return "fail"
    return "wait" if "wait" in decisions else "pass"


def _finite(value: float) -> float | str:
    """JSON has no infinity: record it as a string."""
    return value if math.isfinite(value) else ("inf" if value > 0 else "-inf")
