"""SliCounters: a request into its (sli, class, model) series; a series appears once it counts."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.slis import SliCounters
from runtime.testing.snapshots import SnapshotBuilder

pytestmark = pytest.mark.unit


def streamed(itl_ms: list[float], *, status: int = 200, outcome: str = "ok") -> RequestRecord:
    return RequestRecord(
        request_id="r", route="chat", model="m", klass="c", stream=True, status=status,
        outcome=outcome, itl_ms=itl_ms, timings_ms={"upstream_ttft": 10.0, "e2e": 50.0},
    )  # fmt: skip


def series(registry: CollectorRegistry, kind: str) -> dict[str, float]:
    return {
        sample.labels["sli"]: sample.value
        for family in registry.collect()
        for sample in family.samples
        if sample.name == f"switchyard_sli_{kind}_total" and sample.labels["class"] == "c"
    }


def test_events_and_good_events_per_sli() -> None:
    registry = CollectorRegistry()
    counters = SliCounters(registry)
    snapshot = SnapshotBuilder().add_class("c", band=0, ttft_slo_ms=100, itl_slo_ms=20).snapshot()
    counters.observe(streamed([30.0, 40.0]), snapshot)  # every gap over the ITL objective
    assert series(registry, "events") == {
        "availability": 1, "ttft": 1, "itl": 1, "e2e": 1, "stream_completion": 1,
    }  # fmt: skip
    assert "itl" not in series(registry, "good")  # no good ITL event yet: no series
    assert series(registry, "good") == {
        "availability": 1, "ttft": 1, "e2e": 1, "stream_completion": 1,
    }  # fmt: skip
    counters.observe(streamed([5.0, 6.0]), snapshot)
    counters.observe(streamed([5.0], status=502, outcome="upstream_error"), snapshot)
    assert series(registry, "events") == {
        "availability": 3, "ttft": 3, "itl": 3, "e2e": 2, "stream_completion": 3,
    }  # fmt: skip
    assert series(registry, "good") == {
        "availability": 2, "ttft": 3, "itl": 2, "e2e": 2, "stream_completion": 2,
    }  # fmt: skip
