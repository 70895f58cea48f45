"""The benchmark harness still works: the scenarios at smoke size, end to end.

Runs ``python -m bench run`` as a user would (real simulators, the real router, real Redis)
against direct, the bare proxy and Switchyard, plus the peers if ``python -m bench
setup-peers`` installed them (vllm-router in both scenarios; LiteLLM, which takes ~20 s and
most of a core to start, in the latency one only, to stay within the two-minute budget).
It asserts only that each run completes and writes the report and its plots: the figures
themselves are for people to read, not for a shared 2-core machine to gate on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timing]  # load-shaped: real runs

REPO_ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = REPO_ROOT / "bench" / "scenarios"
# bench/ is run from the repository, not installed: its contract is spelled out here.
VENVS = REPO_ROOT / "bench" / ".venvs"
VLLM_ROUTER = VENVS / "vllm-router" / "bin" / "vllm-router"
LITELLM = VENVS / "litellm" / "bin" / "litellm"
PNG_NAMES = [
    "latency_vs_load.png", "ttft_itl_by_class.png", "slo_goodput.png", "tenant_share.png",
    "router_resources.png",
]  # fmt: skip
REPORT_KEYS = {
    "schema", "scenario", "size", "seed", "command", "machine", "capacity_rps_estimate",
    "targets", "phases", "comparisons", "goals", "plots",
}  # fmt: skip
COMPARISON_KEYS = {"added_latency", "rps_per_core", "cpu_efficiency", "contention", "workers"}
FIGURE_KEYS = {
    "sent", "ok", "achieved_rps", "error_rate", "rejected", "errors", "ttft_ms", "e2e_ms",
    "itl_ms", "send_lag_ms", "classes", "tenants", "jain_weighted", "jain_maxmin", "usage",
}  # fmt: skip


def _router_importable() -> bool:
    try:
        import runtime.gateway.app  # noqa: F401, PLC0415
    except ImportError:
        return False
    return True


def _targets(*, litellm: bool, workers: bool = False) -> list[str]:
    names = ["direct", "bare-proxy"]
    if _router_importable():
        names.append("switchyard")
        if workers:
            names.append("switchyard-2w")
    if VLLM_ROUTER.exists():
        names.append("vllm-router")
    if litellm and LITELLM.exists():
        names.append("litellm")
    return names


def _run(scenario: str, targets: list[str], out: Path) -> dict[str, object]:
    env = {**os.environ, "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")}
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "bench", "run", "--scenario", str(SCENARIOS / f"{scenario}.toml"),
         "--size", "smoke", "--targets", ",".join(targets), "--out", str(out)],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    output = f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    assert done.returncode == 0, f"exit {done.returncode}:\n{output}"
    print(f"{scenario}: {elapsed:.1f}s")
    report = json.loads((out / "report.json").read_text())
    assert set(report) >= REPORT_KEYS
    assert report["scenario"] == scenario
    assert report["size"] == "smoke"
    assert set(report["comparisons"]) >= COMPARISON_KEYS
    assert report["plots"] == PNG_NAMES
    for name in PNG_NAMES:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    for name in targets:
        assert report["targets"][name]["status"] in ("ran", "skipped", "failed")
    assert report["targets"]["direct"]["status"] == "ran", report["targets"]["direct"]
    for phase in report["phases"].values():
        for name, info in report["targets"].items():
            if info["status"] == "ran":
                assert set(phase["targets"][name]) >= FIGURE_KEYS
        assert phase["targets"]["direct"]["sent"] > 0, phase["targets"]["direct"]
    return report


def test_latency_smoke(tmp_path: Path) -> None:
    targets = _targets(litellm=True, workers=True)
    report = _run("latency", targets, tmp_path / "latency")
    assert set(report["phases"]) == {"unloaded", "load-100"}
    assert report["goals"]["added_ttft_p50_ms_unloaded"]["basis"] == "unloaded"
    if "switchyard-2w" in targets:
        assert report["comparisons"]["workers"] is not None
    # The routers' profile: the event loop's lag, and a flame graph (or why not).
    for phase in report["phases"].values():
        for name in ("switchyard", "switchyard-2w"):
            figures = phase["targets"].get(name)
            if figures is None:
                continue
            assert figures["event_loop_lag"]["samples"] > 0
            flame = figures["flame_graph"]
            assert "svg" in flame or flame["skipped"]
            if "svg" in flame:
                assert (tmp_path / "latency" / flame["svg"]).read_text().startswith("<?xml")


def test_contention_smoke(tmp_path: Path) -> None:
    report = _run("contention", _targets(litellm=False), tmp_path / "contention")
    assert set(report["phases"]) == {"baseline", "flood"}
    assert report["goals"]["added_ttft_p50_ms_unloaded"]["measured"] is None
    contention = report["comparisons"]["contention"]
    assert contention is not None
    assert "direct" in contention


def test_prefix_smoke(tmp_path: Path) -> None:
    targets = ["direct", "switchyard"] if _router_importable() else ["direct"]
    report = _run("prefix", targets, tmp_path / "prefix")
    assert set(report["phases"]) == {"load-8"}
    for name in targets:
        cache = report["phases"]["load-8"]["targets"][name]["prefix_cache"]
        assert cache["caches_reset"] is True
        # Every tenant's system prompt is reused from its second request on.
        assert cache["hit_rate"] > 0.3, cache
