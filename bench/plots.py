"""PNG figures of a report (matplotlib, Agg backend: no display, no browser).

Plotly, the dashboard's library, needs kaleido and a headless browser to write PNGs; the
harness uses matplotlib instead (the ``bench`` extra). Every function takes the report dict
and writes one file; :func:`plot_report` writes them all and returns their names.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot, and harmless when already chosen
import matplotlib.pyplot as plt

PNG_NAMES = (
    "latency_vs_load.png",
    "ttft_itl_by_class.png",
    "slo_goodput.png",
    "tenant_share.png",
    "router_resources.png",
)


def _phases_by_load(report: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return sorted(report["phases"].items(), key=lambda kv: kv[1]["offered_rps"])


def _targets(report: Mapping[str, Any]) -> list[str]:
    seen: list[str] = []
    for _, data in _phases_by_load(report):
        seen.extend(t for t in data["targets"] if t not in seen)
    return seen


def _save(fig: Any, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _bars(ax: Any, groups: Sequence[str], series: Mapping[str, Sequence[float]]) -> None:
    width = 0.8 / max(len(series), 1)
    for i, (label, values) in enumerate(series.items()):
        xs = [g + i * width for g in range(len(groups))]
        ax.bar(xs, values, width=width, label=label)
    ticks = [g + 0.4 - width / 2 for g in range(len(groups))]
    ax.set_xticks(ticks, groups, fontsize=7, rotation=20, ha="right")


def latency_vs_load(report: Mapping[str, Any], path: Path) -> None:
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    added = report["comparisons"]["added_latency"]
    phases = _phases_by_load(report)
    for target in _targets(report):
        loads = [d["offered_rps"] for _, d in phases if target in d["targets"]]
        p99 = [d["targets"][target]["ttft_ms"]["p99"] or 0 for _, d in phases
               if target in d["targets"]]  # fmt: skip
        left.plot(loads, p99, marker="o", label=target)
        rows = [(d["offered_rps"], added.get(name, {}).get(target)) for name, d in phases]
        pts = [(x, r) for x, r in rows if r and r["added_ttft_p50_ms"] is not None]
        if pts:
            right.plot([x for x, _ in pts], [r["added_ttft_p50_ms"] for _, r in pts],
                       marker="o", linestyle="--", label=f"{target} p50")  # fmt: skip
            right.plot([x for x, _ in pts], [r["added_ttft_p99_ms"] for _, r in pts],
                       marker="s", label=f"{target} p99")  # fmt: skip
    left.set(title="TTFT p99 by offered load", xlabel="offered requests/s", ylabel="ms (log)")
    left.set_yscale("log")
    right.axhline(0, color="grey", linewidth=0.8)
    right.set_yscale("symlog", linthresh=1.0)  # spans sub-ms to seconds, and noise below 0
    right.set(title="added TTFT vs direct (same run)", xlabel="offered requests/s",
              ylabel="ms (symlog)")  # fmt: skip
    for ax in (left, right):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    _save(fig, path)


def ttft_itl_by_class(report: Mapping[str, Any], path: Path) -> None:
    phases = _phases_by_load(report)
    fig, axes = plt.subplots(2, len(phases), figsize=(4.5 * len(phases), 7), squeeze=False)
    for col, (name, data) in enumerate(phases):
        for row, metric in enumerate(("ttft_ms", "itl_ms")):
            ax = axes[row][col]
            groups: list[str] = []
            series: dict[str, list[float]] = {}
            for target, fig_t in data["targets"].items():
                for klass, cf in fig_t["classes"].items():
                    for q in ("p50", "p95", "p99"):
                        label = f"{klass} {q}"
                        series.setdefault(label, [])
                    if target not in groups:
                        groups.append(target)
                    for q in ("p50", "p95", "p99"):
                        series[f"{klass} {q}"].append(cf[metric][q] or 0.0)
            _bars(ax, groups, series)
            ax.set_title(f"{name}: {metric[:-3].upper()} by class", fontsize=9)
            ax.set_ylabel("ms")
            ax.legend(fontsize=6)
    _save(fig, path)


def slo_goodput(report: Mapping[str, Any], path: Path) -> None:
    phases = _phases_by_load(report)
    fig, axes = plt.subplots(2, len(phases), figsize=(4.5 * len(phases), 7), squeeze=False)
    for col, (name, data) in enumerate(phases):
        groups = list(data["targets"])
        classes = sorted({c for f in data["targets"].values() for c in f["classes"]})
        for row, (key, label) in enumerate((("slo_attainment", "SLO attainment"),
                                            ("goodput_rps", "goodput (req/s)"))):  # fmt: skip
            series = {
                c: [data["targets"][t]["classes"].get(c, {}).get(key) or 0.0 for t in groups]
                for c in classes
            }
            _bars(axes[row][col], groups, series)
            axes[row][col].set_title(f"{name}: {label}", fontsize=9)
            axes[row][col].legend(fontsize=6)
    _save(fig, path)


def tenant_share(report: Mapping[str, Any], path: Path) -> None:
    phases = _phases_by_load(report)
    fig, axes = plt.subplots(1, len(phases), figsize=(4.5 * len(phases), 4), squeeze=False)
    for col, (name, data) in enumerate(phases):
        groups = list(data["targets"])
        tenants = sorted({t for f in data["targets"].values() for t in f["tenants"]})
        series = {
            t: [data["targets"][g]["tenants"].get(t, {}).get("share", 0.0) for g in groups]
            for t in tenants
        }
        ax = axes[0][col]
        labels = [f"{g}\nJain {data['targets'][g]['jain_maxmin']:.2f}" for g in groups]
        _bars(ax, labels, series)
        ax.set_title(f"{name}: service share (Jain's index over max-min fair shares)", fontsize=8)
        ax.set_ylabel("share of service tokens")
        ax.legend(fontsize=6)
    _save(fig, path)


def router_resources(report: Mapping[str, Any], path: Path) -> None:
    fig, (left, right, lag) = plt.subplots(1, 3, figsize=(16, 4))
    phases = _phases_by_load(report)
    for target in _targets(report):
        lags = [(d["offered_rps"], d["targets"][target].get("event_loop_lag") or {})
                for _, d in phases if target in d["targets"]]  # fmt: skip
        lags = [(x, g) for x, g in lags if g.get("samples")]
        if lags:
            lag.plot([x for x, _ in lags], [g["mean_ms"] for _, g in lags], marker="o",
                     label=target)  # fmt: skip
        pts = [(d["offered_rps"], d["targets"][target].get("usage")) for _, d in phases
               if target in d["targets"]]  # fmt: skip
        pts = [(x, u) for x, u in pts if u]
        if not pts:
            continue
        left.plot([x for x, _ in pts], [u["cores_used"] for _, u in pts], marker="o",
                  label=target)  # fmt: skip
        right.plot([x for x, _ in pts], [u["rss_peak_mib"] for _, u in pts], marker="o",
                   label=target)  # fmt: skip
    left.set(title="router CPU", xlabel="offered requests/s", ylabel="cores used")
    right.set(title="router memory", xlabel="offered requests/s", ylabel="peak RSS (MiB)")
    lag.set(title="router event-loop lag", xlabel="offered requests/s", ylabel="mean lag (ms)")
    for ax in (left, right, lag):
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    _save(fig, path)


PLOTTERS: tuple[tuple[str, Callable[[Mapping[str, Any], Path], None]], ...] = (
    ("latency_vs_load.png", latency_vs_load),
    ("ttft_itl_by_class.png", ttft_itl_by_class),
    ("slo_goodput.png", slo_goodput),
    ("tenant_share.png", tenant_share),
    ("router_resources.png", router_resources),
)


def plot_report(report: Mapping[str, Any], out_dir: Path) -> list[str]:
    """Write every figure of ``report`` into ``out_dir``; the file names written."""
    written = []
    for name, plotter in PLOTTERS:
        plotter(report, out_dir / name)
        written.append(name)
    return written


def plot_sweep(sweep: Mapping[str, Any], path: Path) -> None:
    """The swept metric against the parameter's values, one line per target."""
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = [str(v) for v in sweep["values"]]
    for target, values in sweep["metric_by_target"].items():
        pts = [(i, v) for i, v in enumerate(values) if v is not None]
        ax.plot([i for i, _ in pts], [v for _, v in pts], marker="o", label=target)
    ax.set_xticks(range(len(labels)), labels)
    ax.set(xlabel=sweep["param"], ylabel=sweep["metric"],
           title=f"{sweep['scenario']}: {sweep['metric']} ({sweep['phase']})")  # fmt: skip
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    _save(fig, path)
