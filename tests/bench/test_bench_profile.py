"""The bench's router profile (lag histogram deltas) and the 1 vs 2 workers comparison."""

from __future__ import annotations

import pytest

from bench.profile import lag_figures, parse_lag
from bench.report import workers

pytestmark = pytest.mark.unit

SCRAPE = """# HELP switchyard_event_loop_lag_seconds How late...
# TYPE switchyard_event_loop_lag_seconds histogram
switchyard_event_loop_lag_seconds_bucket{le="0.001"} %d
switchyard_event_loop_lag_seconds_bucket{le="0.01"} %d
switchyard_event_loop_lag_seconds_bucket{le="0.1"} %d
switchyard_event_loop_lag_seconds_bucket{le="+Inf"} %d
switchyard_event_loop_lag_seconds_count %d
switchyard_event_loop_lag_seconds_sum %f
switchyard_requests_total{model="m"} 5
"""


def test_the_phase_lag_is_the_difference_of_two_scrapes() -> None:
    before = parse_lag(SCRAPE % (10, 10, 10, 10, 10, 0.005))
    # The phase: 100 samples, 90 under 1 ms, 9 under 10 ms, 1 under 100 ms.
    after = parse_lag(SCRAPE % (100, 109, 110, 110, 110, 0.005 + 0.2))
    assert before["count"] == 10
    figures = lag_figures(before, after)
    assert figures["samples"] == 100
    assert figures["p50_ms_at_most"] == 1.0
    assert figures["p99_ms_at_most"] == 10.0
    assert figures["max_ms_at_most"] == 100.0
    assert figures["mean_ms"] == 2.0
    assert lag_figures(after, after) == {"samples": 0}


def test_worker_processes_histograms_are_summed() -> None:
    two = (SCRAPE % (1, 2, 3, 3, 3, 0.1)) + (SCRAPE % (1, 2, 3, 3, 3, 0.1))
    assert parse_lag(two)["count"] == 6
    assert parse_lag("switchyard_requests_total 1\n") == {}


def test_two_workers_against_one_at_the_budget() -> None:
    per_core = {
        "switchyard": {"achieved_rps": 100.0, "lower_bound": False},
        "switchyard-2w": {"achieved_rps": 170.0, "lower_bound": False},
    }
    phases = {
        "a": {"targets": {"switchyard": {"achieved_rps": 120.0, "error_rate": 0.0},
                          "switchyard-2w": {"achieved_rps": 240.0, "error_rate": 0.0}}},
        "b": {"targets": {"switchyard": {"achieved_rps": 130.0, "error_rate": 0.4},
                          "switchyard-2w": {"achieved_rps": 300.0, "error_rate": 0.0}}},
    }  # fmt: skip
    assert workers(per_core, phases) == {
        "one_worker_rps": 100.0, "two_workers_rps": 170.0, "ratio": 1.7, "lower_bound": False,
        "one_worker_peak_rps": 120.0, "two_workers_peak_rps": 300.0, "peak_ratio": 2.5,
    }  # fmt: skip
    assert workers({"switchyard": per_core["switchyard"]}) is None
