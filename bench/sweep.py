"""Experiment mode: run one scenario once per value of one parameter, plot a metric against it.

``--param`` is a dotted path into the scenario document (``backends.max_num_seqs``,
``switchyard.policies.fairness``, ``tenants.0.rate_share``); ``--metric`` a dotted path
into one target's figures of one phase (``ttft_ms.p99``, ``classes.interactive.
slo_attainment``, ``jain_maxmin``, ``usage.cores_used``).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import plots
from bench.scenario import coerce, load

RunOne = Callable[..., dict[str, Any]]


def metric_of(figures: Any, dotted: str) -> float | None:
    node = figures
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return float(node) if isinstance(node, int | float) and not isinstance(node, bool) else None


def _slug(value: Any) -> str:
    return "".join(ch if ch.isalnum() or ch in "-." else "_" for ch in str(value))[:40]


def sweep(
    scenario_path: Path,
    *,
    param: str,
    values: Sequence[str],
    metric: str,
    phase: str | None,
    out_dir: Path,
    run_one: RunOne,
    **run_kwargs: Any,
) -> dict[str, Any]:
    """Run once per value; write ``sweep.json`` and ``sweep.png`` into ``out_dir``."""
    typed = [coerce(v) for v in values]
    by_target: dict[str, list[float | None]] = {}
    runs = []
    chosen_phase = phase
    for i, value in enumerate(typed):
        scenario = load(scenario_path, {param: value})
        run_dir = out_dir / f"{i:02d}-{_slug(value)}"
        result = run_one(scenario, out_dir=run_dir, **run_kwargs)
        chosen_phase = chosen_phase or list(result["phases"])[-1]
        targets = result["phases"].get(chosen_phase, {}).get("targets", {})
        for name in set(by_target) | set(targets):
            by_target.setdefault(name, [None] * i).append(metric_of(targets.get(name), metric))
        runs.append({"value": value, "report": str(run_dir / "report.json")})
    summary = {
        "scenario": scenario_path.stem,
        "param": param,
        "values": typed,
        "metric": metric,
        "phase": chosen_phase,
        "metric_by_target": by_target,
        "runs": runs,
        "plot": "sweep.png",
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "sweep.json").write_text(json.dumps(summary, indent=2, default=str) + "\n")
    plots.plot_sweep(summary, out_dir / "sweep.png")
    return summary
