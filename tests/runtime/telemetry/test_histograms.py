"""Observing many values at once gives the histogram observe() would."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Histogram

from runtime.telemetry.histograms import observe_many

pytestmark = pytest.mark.unit

BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 1.0)


def samples(histogram: Histogram) -> dict[tuple[str, str], float]:
    [metric] = histogram.collect()
    return {(s.name, s.labels.get("le", "")): s.value for s in metric.samples
            if not s.name.endswith("_created")}  # fmt: skip


@settings(max_examples=100, deadline=None)
@given(values=st.lists(st.sampled_from([*BUCKETS, 0.0, 2.0]) | st.floats(0, 3), max_size=30))
def test_observe_many_matches_observe_one_by_one(values: list[float]) -> None:
    one = Histogram("one", "", buckets=BUCKETS, registry=CollectorRegistry())
    many = Histogram("many", "", buckets=BUCKETS, registry=CollectorRegistry())
    for value in values:
        one.observe(value / 1000.0)
    observe_many(many, [v * 1.0 for v in values], scale=0.001)
    got = {(name.replace("many", "one"), le): v for (name, le), v in samples(many).items()}
    want = samples(one)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert got[key] == pytest.approx(value, abs=1e-12), key
