"""The gates' evaluator: read the routers' per-version telemetry, decide, act.

For a running rollout (canary or A/B), the window is the current step so far, at most
``step_window_s`` back. Stable and candidate are read over the same window
(``runtime.telemetry.versions.read_window``), the gates in ``apps.rollouts.gates`` decide:

- ``fail`` → :func:`rollout_rollback` (one snapshot publish), the evidence in the event;
- ``pass`` and the step has run ``step_window_s`` → :func:`rollout_advance` (a canary's last
  step promotes; an A/B or shadow rollout stays as it is until an operator promotes it);
- otherwise nothing changes and nothing is written.

A shadow rollout's candidate numbers are the mirrored copies (the router records them under
the candidate's label, without tokens, so its cost gate reads "unpriced or no tokens").
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis
from django.conf import settings
from django.core.exceptions import ValidationError
from django.db.models import Min
from django.utils import timezone

from apps.billing.models import Price
from apps.models.models import ModelVersion
from apps.rollouts import gates
from apps.rollouts.models import Rollout
from apps.rollouts.transitions import rollout_advance, rollout_rollback
from apps.tenants.models import RequestClass
from runtime import contract, redis_conn
from runtime.telemetry.versions import (
    E2E_BOUNDS_MS,
    ITL_BOUNDS_MS,
    TTFT_BOUNDS_MS,
    WindowStats,
    read_window,
)


@dataclass(frozen=True, slots=True)
class Evaluation:
    decision: str  # "pass" | "fail" | "wait"
    action: str  # "rollback" | "advance" | "promote" | "none"
    evidence: dict[str, Any]


def telemetry_namespace() -> str:
    return contract.namespace_of(str(settings.SNAPSHOT_REDIS_PREFIX))


def _price_per_1k(version: ModelVersion) -> tuple[float, float] | None:
    price = Price.objects.filter(version=version).order_by("hardware_tier").first()
    if price is None:
        return None
    return float(price.input_per_1k), float(price.output_per_1k)


def _cost(stats: WindowStats, price: tuple[float, float] | None) -> float | None:
    if price is None:
        return None
    return gates.cost_per_1k(
        prompt_tokens=stats.prompt_tokens,
        completion_tokens=stats.completion_tokens,
        input_per_1k=price[0],
        output_per_1k=price[1],
    )


def gate_results(
    rollout: Rollout, stable: WindowStats, candidate: WindowStats
) -> list[gates.GateResult]:
    """The four gates of ``rollout`` over one window's totals (errors, TTFT, ITL, cost)."""
    minimum = rollout.min_samples
    return [
        gates.error_rate_gate(
            stable_requests=stable.requests,
            stable_errors=stable.errors,
            candidate_requests=candidate.requests,
            candidate_errors=candidate.errors,
            max_delta=rollout.max_error_rate_delta,
            min_samples=minimum,
        ),
        _first_answer_gate(rollout, stable, candidate),
        gates.latency_gate(
            name="itl_p95",
            bounds=ITL_BOUNDS_MS,
            stable=stable.itl_counts,
            candidate=candidate.itl_counts,
            max_ratio=rollout.max_itl_p95_ratio,
            min_samples=minimum,
            requests=(stable.requests, candidate.requests),  # unary-only traffic has no ITL
            objective=itl_objective_ms(),
        ),
        gates.cost_gate(
            stable_cost_per_1k=_cost(stable, _price_per_1k(rollout.stable_version)),
            candidate_cost_per_1k=_cost(candidate, _price_per_1k(rollout.candidate_version)),
            stable_requests=stable.requests,
            candidate_requests=candidate.requests,
            max_ratio=rollout.max_cost_ratio,
            min_samples=minimum,
        ),
    ]


def itl_objective_ms() -> float | None:
    """The strictest request class's ITL objective (p95, ms); None without classes."""
    strictest = RequestClass.objects.aggregate(least=Min("itl_slo_ms"))["least"]
    return None if strictest is None else float(strictest)


def _first_answer_gate(
    rollout: Rollout, stable: WindowStats, candidate: WindowStats
) -> gates.GateResult:
    """TTFT p95 over the streams; for unary-only traffic (no stream on either side, e.g. an
    encoder) the end-to-end p95 of the unary requests instead, so the gate is never blind
    (a unary request's first byte is its whole answer: it is no TTFT)."""
    streams = sum(stable.ttft_counts) + sum(candidate.ttft_counts)
    unary = sum(stable.e2e_counts) + sum(candidate.e2e_counts)
    if streams == 0 and unary > 0:
        return gates.latency_gate(
            name="e2e_p95", bounds=E2E_BOUNDS_MS, stable=stable.e2e_counts,
            candidate=candidate.e2e_counts, max_ratio=rollout.max_ttft_p95_ratio,
            min_samples=rollout.min_samples,
        )  # fmt: skip
    return gates.latency_gate(
        name="ttft_p95",
        bounds=TTFT_BOUNDS_MS,
        stable=stable.ttft_counts,
        candidate=candidate.ttft_counts,
        max_ratio=rollout.max_ttft_p95_ratio,
        min_samples=rollout.min_samples,
    )


def _window(rollout: Rollout, client: redis.Redis[bytes], now: float) -> Mapping[str, WindowStats]:
    started = rollout.step_started_at.timestamp() if rollout.step_started_at else now
    since = max(started, now - rollout.step_window_s)
    return read_window(
        client,
        namespace=telemetry_namespace(),
        model=rollout.model.name,
        versions=[rollout.stable_version.label, rollout.candidate_version.label],
        since=since,
        until=now,
    )


def rollout_evaluate(
    *, rollout: Rollout, client: redis.Redis[bytes], now: float | None = None
) -> Evaluation:
    """Evaluate one rollout's gates and act on the decision (see the module docstring)."""
    now = time.time() if now is None else now
    if rollout.state != Rollout.State.RUNNING:
        return Evaluation("wait", "none", {})
    totals = _window(rollout, client, now)
    stable = totals[rollout.stable_version.label]
    candidate = totals[rollout.candidate_version.label]
    results = gate_results(rollout, stable, candidate)
    decision = gates.overall(results)
    step = rollout.current_step
    evidence = {
        "decision": decision,
        "decided_at": now,
        "step": step,
        "stable": stable.summary(),
        "candidate": candidate.summary(),
        "gates": [result.as_dict() for result in results],
    }
    if decision == "fail":
        failed = ", ".join(r.gate for r in results if r.decision == "fail")
        rollout_rollback(
            actor=None, rollout=rollout, reason=f"Gate failed: {failed}.", evidence=evidence
        )
        return Evaluation(decision, "rollback", evidence)
    elapsed = now - rollout.step_started_at.timestamp() if rollout.step_started_at else 0.0
    if decision == "pass" and elapsed >= rollout.step_window_s:
        if rollout.mode != Rollout.Mode.CANARY:
            return Evaluation(decision, "none", evidence)
        rollout_advance(
            actor=None,
            rollout=rollout,
            reason="Gates passed for the step's window.",
            evidence=evidence,
            from_step=step,  # the step these gates judged: advanced once
        )
        action = "promote" if rollout.state == Rollout.State.PROMOTED else "advance"
        return Evaluation(decision, action, evidence)
    return Evaluation(decision, "none", evidence)


def rollouts_evaluate_running(*, now: float | None = None) -> dict[int, str]:
    """Evaluate every running rollout (the beat task); returns rollout id → action."""
    actions: dict[int, str] = {}
    client: redis.Redis[bytes] = redis_conn.from_url(
        settings.REDIS_URL, socket_connect_timeout=1.0, socket_timeout=5.0
    )
    try:
        running = Rollout.objects.select_related(
            "model", "stable_version", "candidate_version"
        ).filter(state=Rollout.State.RUNNING, step_started_at__lte=timezone.now())
        for rollout in running:
            try:
                evaluation = rollout_evaluate(rollout=rollout, client=client, now=now)
            except ValidationError:  # an operator moved it meanwhile; their action stands
                actions[rollout.pk] = "skipped"
            else:
                actions[rollout.pk] = evaluation.action
    finally:
        client.close()
    return actions
