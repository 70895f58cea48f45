"""The tables :mod:`bench.dispatch_sim` prints: per tenant and class TTFT percentiles, each
well-behaved tenant's p95 under the flood over its baseline, the prefix-cache figures and the
flow (tokens/s, SLO share, preemptions, re-prefilled tokens) of each phase."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from bench.scenario import Scenario

if TYPE_CHECKING:
    from bench.dispatch_sim import _Run


@dataclass(frozen=True, slots=True)
class Outcome:
    phase: str
    tenant: str
    klass: str
    ttft_s: float | None  # None: refused or dropped


@dataclass(slots=True)
class Flow:
    """One phase's output: tokens generated (in all, and within the phase's duration from
    its start), preemptions and the tokens their resumes re-prefilled."""

    start: float = 0.0
    tokens: int = 0
    window_tokens: int = 0
    preemptions: int = 0
    repeated: int = 0  # preemptions of a generation preempted before
    reprefilled: int = 0
    capped: int = 0  # requests whose max_tokens a cap_tokens degradation lowered
    tokens_capped: int = 0  # the output tokens those caps took away (asked - cap)
    # per resume, seconds: from the preemption to its next token, one prefill of its context,
    # and from its new grant to that token (the engine's part of the pause)
    pauses: list[tuple[float, float, float]] = field(default_factory=list)


def prefix_table(run: _Run) -> dict[str, dict[str, float | None]]:
    """Per phase: every request's TTFT p50 / p95 in ms, the share within its class's TTFT SLO
    (refused ones count as missed), the engines' prefix-cache hit rate (hit over queried
    prompt tokens) and the share of placements the sticky rule made."""
    out: dict[str, dict[str, float | None]] = {}
    classes = run.scenario.classes
    for phase in run.scenario.phases:
        rows = [o for o in run.outcomes if o.phase == phase.name]
        ms = [o.ttft_s * 1000.0 for o in rows if o.ttft_s is not None]
        met = sum(
            1
            for o in rows
            if o.ttft_s is not None and o.ttft_s * 1000.0 <= classes[o.klass].ttft_slo_ms
        )
        queried, hit = run.cache_tokens.get(phase.name, [0, 0])
        placed = run.placements.get(phase.name, (0, 0))
        out[f"{phase.name} all"] = {
            "n": len(ms), "p50_ms": _pct(ms, 0.5), "p95_ms": _pct(ms, 0.95),
            "slo_share": met / len(rows) if rows else None,
            "hit_rate": hit / queried if queried else None,
            "sticky_share": placed[0] / sum(placed) if sum(placed) else None,
        }  # fmt: skip
    return out


def flow_table(run: _Run) -> dict[str, dict[str, float | None]]:
    """Per phase: output tokens/s within the phase's duration, the interactive class's TTFT
    SLO share and availability (share served) over the tenants that do not flood,
    preemptions, re-prefilled tokens, the requests and tokens degradation capped, and the
    resumes' pause p50 / p95 (ms), the p95 of each pause over one prefill of the resumed
    context, and the same for the pause's engine part (from the new grant to the token)."""
    out: dict[str, dict[str, float | None]] = {}
    flooders = {t.name for t in run.scenario.tenants if t.flooding}
    slo_ms = {name: spec.ttft_slo_ms for name, spec in run.scenario.classes.items()}
    for phase in run.scenario.phases:
        flow = run.flow.get(phase.name, Flow())
        rows = [o for o in run.outcomes if o.phase == phase.name and o.tenant not in flooders
                and o.klass == "interactive"]  # fmt: skip
        met = sum(1 for o in rows if o.ttft_s is not None and o.ttft_s * 1000 <= slo_ms[o.klass])
        out[f"{phase.name} flow"] = {
            "tokens_per_s": flow.window_tokens / run.phase_s if run.phase_s > 0 else None,
            "tokens": float(flow.tokens),
            "slo_share": met / len(rows) if rows else None,
            "available": sum(1 for o in rows if o.ttft_s is not None) / len(rows) if rows else None,
            "preemptions": float(flow.preemptions),
            "repeated": float(flow.repeated),
            "reprefilled": float(flow.reprefilled),
            "capped": float(flow.capped),
            "tokens_capped": float(flow.tokens_capped),
            "pause_p50_ms": _ms(_pct([p for p, _, _ in flow.pauses], 0.5)),
            "pause_p95_ms": _ms(_pct([p for p, _, _ in flow.pauses], 0.95)),
            "pause_over_prefill_p95": _pct([p / one for p, one, _ in flow.pauses if one], 0.95),
            "engine_over_prefill_p95": _pct([e / one for _, one, e in flow.pauses if one], 0.95),
        }
    return out


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(scenario: Scenario, outcomes: Sequence[Outcome]) -> dict[str, dict[str, float | None]]:
    """``"phase tenant class"`` -> n, failed, p50_ms, p95_ms; ``"ratio tenant"`` -> the
    tenant's TTFT p95 (every class) in the last phase over the first, for non-flooders."""
    out: dict[str, dict[str, float | None]] = {}
    for phase in scenario.phases:
        for tenant in scenario.tenants:
            for klass in sorted(tenant.classes):
                where = (phase.name, tenant.name, klass)
                rows = [o for o in outcomes if (o.phase, o.tenant, o.klass) == where]
                ms = [o.ttft_s * 1000.0 for o in rows if o.ttft_s is not None]
                out[f"{phase.name} {tenant.name} {klass}"] = {
                    "n": len(ms), "failed": len(rows) - len(ms),
                    "p50_ms": _pct(ms, 0.5), "p95_ms": _pct(ms, 0.95),
                }  # fmt: skip
    first, last = scenario.phases[0].name, scenario.phases[-1].name
    for tenant in scenario.tenants:
        if tenant.flooding:
            continue
        p95 = {
            name: _pct([o.ttft_s for o in outcomes
                        if o.phase == name and o.tenant == tenant.name and o.ttft_s is not None],
                       0.95)
            for name in (first, last)
        }  # fmt: skip
        base, flood = p95[first], p95[last]
        out[f"ratio {tenant.name}"] = {
            "p95_over_baseline": flood / base if base and flood else None
        }
    return out


def cell(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    if name in (
        "p95_over_baseline",
        "hit_rate",
        "sticky_share",
        "slo_share",
        "pause_over_prefill_p95",
        "engine_over_prefill_p95",
    ):
        return f"{value:.2f}"
    if name == "available":
        return f"{value:.4f}"
    return f"{value:.0f}"
