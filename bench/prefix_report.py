"""Prefix routing's figures from a saved harness report, as ratios against a baseline target.

``python -m bench.prefix_report bench/results/<run>/report.json [--baseline
switchyard-load-only]`` prints, per phase (offered load) and target: the stream TTFT p50 /
p95, the SLO class's goodput (streams within the TTFT SLO per second), the engines' prefix
cache hit rate (``prefix_cache.hit_rate``), and each figure over the baseline target's in the
same phase; a phase where the load generator fell behind (``client_saturated``) is marked
``SATURATED`` and its ratios are not to be used. ``p50 sent`` is the TTFT p50 over every stream
sent (``stream_ttft_ms_sent``: an unanswered stream counts as the slowest; ``-`` when the p50
falls among those), which past capacity is the fair one to compare: the answered-only p50 leaves
out the requests the drain cut, and a router that answers fewer leaves out more. The same
table serves the latency and contention scenarios (no shared prefixes: the ratios there say
what prefix routing costs).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _get(data: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(data, Mapping):
            return None
        data = data.get(key)
    return data


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or base is None or base == 0 or not math.isfinite(base):
        return None
    return value / base


def rows(report: Mapping[str, Any], baseline: str, slo_class: str) -> list[dict[str, Any]]:
    """One row per (phase, target): the figures and their ratios over ``baseline``'s."""
    out: list[dict[str, Any]] = []
    for phase, body in (report.get("phases") or {}).items():
        targets = body.get("targets") or {}
        base = targets.get(baseline) or {}
        for name, figures in targets.items():
            if not isinstance(figures, Mapping) or "stream_ttft_ms" not in figures:
                continue
            row: dict[str, Any] = {
                "phase": phase,
                "target": name,
                "p50": _get(figures, "stream_ttft_ms", "p50"),
                "p95": _get(figures, "stream_ttft_ms", "p95"),
                # over every stream sent (unanswered ones the slowest; None: beyond the phase)
                "p50_sent": _get(figures, "stream_ttft_ms_sent", "p50"),
                "unanswered": _get(figures, "stream_ttft_ms_sent", "unanswered"),
                "goodput": _get(figures, "classes", slo_class, "goodput_rps"),
                "slo": _get(figures, "classes", slo_class, "slo_attainment"),
                "hit_rate": _get(figures, "prefix_cache", "hit_rate"),
                "saturated": bool(figures.get("client_saturated"))
                or bool(base.get("client_saturated")),
            }
            for key in ("p50", "p95", "p50_sent", "goodput"):
                base_key = {"p50": ("stream_ttft_ms", "p50"), "p95": ("stream_ttft_ms", "p95"),
                            "p50_sent": ("stream_ttft_ms_sent", "p50"),
                            "goodput": ("classes", slo_class, "goodput_rps")}[key]  # fmt: skip
                row[f"{key}_ratio"] = _ratio(row[key], _get(base, *base_key))
            out.append(row)
    return out


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("report", type=Path)
    parser.add_argument("--baseline", default="switchyard-load-only")
    parser.add_argument("--slo-class", default="interactive")
    args = parser.parse_args(argv)
    report = json.loads(args.report.read_text())
    print(f"baseline: {args.baseline}; ratios are target / baseline in the same phase")
    print(f"{'phase':<10} {'target':<26} {'p50 ms':>8} {'p95 ms':>8} {'good/s':>7} {'slo':>5} "
          f"{'hit':>5} {'p50 x':>6} {'p95 x':>6} {'good x':>6} {'p50 sent':>9} {'unans':>5} "
          f"{'sent x':>6}")  # fmt: skip
    for row in rows(report, args.baseline, args.slo_class):
        flag = "  SATURATED" if row["saturated"] else ""
        print(f"{row['phase']:<10} {row['target']:<26} {_fmt(row['p50'], '8.1f')} "
              f"{_fmt(row['p95'], '8.1f')} {_fmt(row['goodput'], '7.2f')} "
              f"{_fmt(row['slo'], '5.2f')} {_fmt(row['hit_rate'], '5.2f')} "
              f"{_fmt(row['p50_ratio'], '6.2f')} {_fmt(row['p95_ratio'], '6.2f')} "
              f"{_fmt(row['goodput_ratio'], '6.2f')} {_fmt(row['p50_sent'], '9.1f')} "
              f"{_fmt(row['unanswered'], '5d')} "
              f"{_fmt(row['p50_sent_ratio'], '6.2f')}{flag}")  # fmt: skip


if __name__ == "__main__":
    main()
