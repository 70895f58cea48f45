"""Figures of one (phase, target): latency percentiles, SLOs, goodput, fairness, errors.

Definitions (also in bench/README.md):

- TTFT: time to the first content token of a stream; for a unary request, time to the whole
  answer (the first byte a client can use).
- ITL: gaps between consecutive content tokens of a stream, pooled over requests.
- SLO attained: the request succeeded and its TTFT is within its class's ``ttft_slo_ms``;
  attainment = attained / sent (errors and rejections count as misses).
- Goodput: attained requests per second of phase (and their output tokens per second).
- Service: ``prompt + 2 * output`` tokens of successful requests (the weighted token cost of
  ``runtime.scheduling.metrics``); a tenant's share is its fraction of all service.
- Jain (weighted): Jain's index over service / weight, all tenants (1 = equal).
- Jain (max-min): Jain's index over service / the weighted max-min fair allocation of the
  service actually delivered given each tenant's demand, so a tenant that asked for less
  than its fair share is not counted as starved.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bench.loadgen import PhaseRun, Result
from bench.procs import Usage
from bench.scenario import Scenario
from bench.workload import PhasePlan
from runtime.scheduling.metrics import jain_index

PERCENTILES = (50, 90, 95, 99)
# Send lag p99 above this: the load generator (or the machine) fell behind the schedule, so
# the phase measures the client as much as the target.
SATURATED_LAG_MS = 10.0


def percentile(sorted_values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile of an ascending sequence; None when empty."""
    if not sorted_values:
        return None
    pos = (len(sorted_values) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    if lo == hi:
        return sorted_values[lo]
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (pos - lo)


def sent_dist_ms(answered: Iterable[float], unanswered: int) -> dict[str, float | int | None]:
    """Percentiles over every request sent, in milliseconds: one that got no first token (an
    error, or cancelled at the drain) counts as slower than every answered one, so a percentile
    that falls among those is None ("beyond the phase"). Past capacity the answered-only
    percentiles of ``dist_ms`` leave out exactly the slowest requests; these do not."""
    xs = sorted(answered)
    n = len(xs) + unanswered
    out: dict[str, float | int | None] = {"count": n, "unanswered": unanswered}
    for q in PERCENTILES:
        pos = (n - 1) * q / 100.0  # the answered hold positions 0 .. len(xs) - 1, in order
        p = None
        if n and math.ceil(pos) < len(xs):
            lo, hi = math.floor(pos), math.ceil(pos)
            p = xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)
        out[f"p{q}"] = None if p is None else round(1000 * p, 4)
    return out


def dist_ms(values: Iterable[float]) -> dict[str, float | int | None]:
    """count, mean and percentiles of seconds, in milliseconds."""
    xs = sorted(values)
    out: dict[str, float | int | None] = {"count": len(xs)}
    out["mean"] = round(1000 * sum(xs) / len(xs), 4) if xs else None
    for q in PERCENTILES:
        p = percentile(xs, q)
        out[f"p{q}"] = None if p is None else round(1000 * p, 4)
    out["max"] = round(1000 * xs[-1], 4) if xs else None
    return out


def maxmin_allocation(
    demand: Mapping[str, float], weights: Mapping[str, float], total: float
) -> dict[str, float]:
    """Weighted max-min fair split of ``total`` among tenants asking for ``demand``."""
    alloc = dict.fromkeys(demand, 0.0)
    active = {t for t, d in demand.items() if d > 0}
    left = total
    while active and left > 1e-9:
        weight_sum = sum(weights[t] for t in active)
        unit = left / weight_sum
        satisfied = {t for t in active if demand[t] - alloc[t] <= unit * weights[t]}
        if not satisfied:
            for t in active:
                alloc[t] += unit * weights[t]
            break
        for t in satisfied:
            left -= demand[t] - alloc[t]
            alloc[t] = demand[t]
        active -= satisfied
    return alloc


def _cost(prompt: int, output: int) -> float:
    return float(prompt + 2 * output)


def tenant_figures(scenario: Scenario, results: Sequence[Result]) -> dict[str, Any]:
    weights = {t.name: t.weight for t in scenario.tenants}
    demand: dict[str, float] = defaultdict(float)
    served: dict[str, float] = defaultdict(float)
    ttfts: dict[str, list[float]] = defaultdict(list)
    stream_ttfts: dict[str, list[float]] = defaultdict(list)
    sent: Counter[str] = Counter()
    for r in results:
        p = r.planned
        sent[p.tenant] += 1
        demand[p.tenant] += _cost(p.prompt_tokens, p.max_tokens)
        if r.ok:
            served[p.tenant] += _cost(p.prompt_tokens, r.tokens)
            if r.ttft is not None:
                ttfts[p.tenant].append(r.ttft)
                if p.stream:
                    stream_ttfts[p.tenant].append(r.ttft)
    names = [t.name for t in scenario.tenants if sent[t.name]]
    total = sum(served[n] for n in names)
    fair = maxmin_allocation({n: demand[n] for n in names}, weights, total)
    total_weight = sum(weights[n] for n in names) or 1.0
    per: dict[str, Any] = {}
    for n in names:
        per[n] = {
            "sent": sent[n],
            "service_tokens": served[n],
            "share": served[n] / total if total else 0.0,
            "entitled_share": weights[n] / total_weight,
            "demand_share": demand[n] / (sum(demand[m] for m in names) or 1.0),
            "maxmin_fair_share": fair[n] / total if total else 0.0,
            "ttft_ms": dist_ms(ttfts[n]),
            "stream_ttft_ms": dist_ms(stream_ttfts[n]),
        }
    normalized = [served[n] / weights[n] for n in names]
    satisfaction = [served[n] / fair[n] if fair[n] > 0 else 1.0 for n in names]
    return {
        "tenants": per,
        "jain_weighted": jain_index(normalized),
        "jain_maxmin": jain_index(satisfaction),
        "max_service_gap_tokens": (max(normalized) - min(normalized)) if normalized else 0.0,
    }


def _attainment(results: Sequence[Result], slo_ms: float) -> tuple[int, int]:
    """(met, counted) for a TTFT SLO over streamed requests: only a stream shows its first
    token (a unary answer's "TTFT" is its whole generation); every stream sent counts, a
    failed one as missed."""
    streams = [r for r in results if r.planned.stream]
    met = [r for r in streams if r.ok and r.ttft is not None and r.ttft * 1000 <= slo_ms]
    return len(met), len(streams)


def class_figures(scenario: Scenario, results: Sequence[Result], duration: float) -> dict[str, Any]:
    """Per class: TTFT SLO attainment over its streams (``slo_attainment``; also per tenant
    in ``by_tenant``) and, for comparison with runs before that rule, over every request
    with a unary answer's whole latency as its TTFT (``slo_attainment_all``)."""
    out: dict[str, Any] = {}
    for name, spec in scenario.classes.items():
        rs = [r for r in results if r.planned.klass == name]
        slo_ms = spec.ttft_slo_ms
        met_all = [r for r in rs if r.ok and r.ttft is not None and r.ttft * 1000 <= slo_ms]
        streams = [r for r in rs if r.ok and r.planned.stream and r.ttft is not None]
        met, counted = _attainment(rs, spec.ttft_slo_ms)
        by_tenant: dict[str, Any] = {}
        for tenant in sorted({r.planned.tenant for r in rs}):
            mine = [r for r in rs if r.planned.tenant == tenant]
            t_met, t_counted = _attainment(mine, spec.ttft_slo_ms)
            by_tenant[tenant] = {
                "streams": t_counted,
                "met": t_met,
                "slo_attainment": t_met / t_counted if t_counted else None,
                "stream_ttft_ms": dist_ms(
                    r.ttft for r in mine if r.ok and r.planned.stream and r.ttft is not None
                ),
            }
        out[name] = {
            "sent": len(rs),
            "ok": sum(1 for r in rs if r.ok),
            "ttft_slo_ms": spec.ttft_slo_ms,
            "slo_attainment": met / counted if counted else None,
            "slo_attainment_all": len(met_all) / len(rs) if rs else None,
            "goodput_rps": len(met_all) / duration if duration > 0 else 0.0,
            "goodput_tokens_per_s": sum(r.tokens for r in met_all) / duration if duration else 0.0,
            "ttft_ms": dist_ms(r.ttft for r in rs if r.ok and r.ttft is not None),
            "stream_ttft_ms": dist_ms(r.ttft for r in streams if r.ttft is not None),
            "unary_e2e_ms": dist_ms(r.end - r.sent for r in rs if r.ok and not r.planned.stream),
            "itl_ms": dist_ms(g for r in streams for g in r.gaps),
            "by_tenant": by_tenant,
        }
    return out


def phase_figures(
    scenario: Scenario, plan: PhasePlan, run: PhaseRun, usage: Usage | None
) -> dict[str, Any]:
    """Everything measured for one target in one phase."""
    results = run.results
    ok = [r for r in results if r.ok]
    errors = Counter(r.error for r in results if not r.ok)
    rejected = sum(n for kind, n in errors.items() if kind.startswith("rejected"))
    duration = plan.duration_s
    stream_ok = [r for r in ok if r.planned.stream]
    lags = sorted(max(r.lag, 0.0) for r in results if r.sent > 0)
    figures: dict[str, Any] = {
        "sent": len(results),
        "ok": len(ok),
        "achieved_rps": len(ok) / max(duration, run.wall_s, 1e-9),
        "error_rate": (len(results) - len(ok)) / len(results) if results else 0.0,
        "rejected": rejected,
        "errors": dict(sorted(errors.items())),
        "cancelled_at_drain": run.cancelled,
        "client_gc_ms": {  # the load generator's collections in the phase (its send lag's cause)
            "count": len(run.gc_pauses_ms),
            "max": round(max(run.gc_pauses_ms, default=0.0), 3),
            "total": round(sum(run.gc_pauses_ms), 3),
        },
        "output_tokens_per_s": sum(r.tokens for r in ok) / max(duration, run.wall_s, 1e-9),
        "ttft_ms": dist_ms(r.ttft for r in ok if r.ttft is not None),
        "e2e_ms": dist_ms(r.end - r.sent for r in ok),
        "stream_ttft_ms": dist_ms(r.ttft for r in stream_ok if r.ttft is not None),
        "stream_ttft_ms_sent": sent_dist_ms(
            (r.ttft for r in stream_ok if r.ttft is not None),
            sum(1 for r in results if r.planned.stream and not (r.ok and r.ttft is not None)),
        ),
        "itl_ms": dist_ms(g for r in stream_ok for g in r.gaps),
        "send_lag_ms": {
            "p50": round(1000 * (percentile(lags, 50) or 0.0), 3),
            "p99": round(1000 * (percentile(lags, 99) or 0.0), 3),
            "max": round(1000 * (lags[-1] if lags else 0.0), 3),
        },
        "classes": class_figures(scenario, results, duration),
        **tenant_figures(scenario, results),
    }
    figures["client_saturated"] = figures["send_lag_ms"]["p99"] > SATURATED_LAG_MS
    figures["usage"] = usage.as_dict() if usage is not None else None
    if usage is not None and usage.cores > 0:
        figures["rps_per_cpu_core_used"] = figures["achieved_rps"] / usage.cores
    return figures
