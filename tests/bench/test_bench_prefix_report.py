"""The prefix report reads a saved harness report and sets each target against the baseline."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.metrics import sent_dist_ms
from bench.prefix_report import main, rows

pytestmark = pytest.mark.unit


def _target(p50: float, goodput: float, hit: float | None, *, saturated: bool = False) -> dict:
    return {
        "stream_ttft_ms": {"p50": p50, "p95": p50 * 2},
        "classes": {"interactive": {"goodput_rps": goodput, "slo_attainment": 0.9}},
        "prefix_cache": {"hit_rate": hit},
        "client_saturated": saturated,
    }


REPORT = {
    "phases": {
        "load-24": {
            "targets": {
                "switchyard-load-only": _target(600.0, 10.0, 0.4),
                "switchyard": _target(150.0, 18.0, 0.8),
                "vllm-router-cache-aware": {"skipped": "not installed"},
            }
        },
        "load-32": {
            "targets": {
                "switchyard-load-only": _target(900.0, 5.0, None, saturated=True),
                "switchyard": _target(300.0, 12.0, 0.7),
            }
        },
    }
}


def test_ratios_are_against_the_baseline_in_the_same_phase() -> None:
    found = rows(REPORT, "switchyard-load-only", "interactive")
    table = {(r["phase"], r["target"]): r for r in found}
    assert set(table) == {
        ("load-24", "switchyard-load-only"),
        ("load-24", "switchyard"),
        ("load-32", "switchyard-load-only"),
        ("load-32", "switchyard"),
    }
    prefix = table[("load-24", "switchyard")]
    assert prefix["p50_ratio"] == pytest.approx(0.25)
    assert prefix["goodput_ratio"] == pytest.approx(1.8)
    assert prefix["hit_rate"] == 0.8
    assert not prefix["saturated"]
    assert table[("load-32", "switchyard")]["saturated"]  # the baseline's phase was


def test_the_command_prints_the_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "report.json"
    path.write_text(json.dumps(REPORT))
    main([str(path)])
    out = capsys.readouterr().out
    assert "load-24    switchyard " in out
    assert "SATURATED" in out


def test_percentiles_over_every_stream_sent_count_the_unanswered_as_slowest() -> None:
    answered = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6]
    assert sent_dist_ms(answered, 0)["p50"] == pytest.approx(350.0)  # as over the answered
    cut = sent_dist_ms(answered, 4)  # 10 sent: the p50 moves up to the 5th/6th answered
    assert cut["count"] == 10
    assert cut["unanswered"] == 4
    assert cut["p50"] == pytest.approx(550.0)
    assert cut["p90"] is None  # falls among the unanswered: beyond the phase
    assert sent_dist_ms([], 3)["p50"] is None
    assert sent_dist_ms([], 0) == {"count": 0, "unanswered": 0, "p50": None, "p90": None,
                                   "p95": None, "p99": None}  # fmt: skip


def test_the_sent_p50_ratio_is_against_the_baseline() -> None:
    report = json.loads(json.dumps(REPORT))
    targets = report["phases"]["load-24"]["targets"]
    targets["switchyard-load-only"]["stream_ttft_ms_sent"] = {"p50": 800.0, "unanswered": 30}
    targets["switchyard"]["stream_ttft_ms_sent"] = {"p50": 160.0, "unanswered": 0}
    table = {(r["phase"], r["target"]): r for r in rows(report, "switchyard-load-only", "x")}
    assert table[("load-24", "switchyard")]["p50_sent_ratio"] == pytest.approx(0.2)
    assert table[("load-24", "switchyard-load-only")]["unanswered"] == 30
    assert table[("load-32", "switchyard")]["p50_sent_ratio"] is None  # not recorded
