"""The SLI counters kept as plain numbers in one process (issue #27) export exactly what the
prometheus_client counters they replace export: the same exposition text, ``_created``
samples included (or left out, as prometheus_client's switch says)."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client import metrics as prometheus_metrics

from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.slis import SliCounters
from runtime.testing.snapshots import SnapshotBuilder

pytestmark = pytest.mark.unit

Record = RequestRecord


def records() -> list[RequestRecord]:
    def one(klass: str, model: str, itl_ms: list[float], status: int, outcome: str) -> Record:
        return RequestRecord(
            request_id="r", route="chat", model=model, klass=klass, stream=True, status=status,
            outcome=outcome, itl_ms=itl_ms, timings_ms={"upstream_ttft": 10.0, "e2e": 50.0},
        )  # fmt: skip

    return [
        one("c", "m", [30.0, 40.0], 200, "ok"),
        one("c", "m", [5.0, 6.0], 200, "ok"),
        one("b", "m", [5.0], 502, "upstream_error"),
        one("c", "n", [5.0, 6.0], 200, "ok"),
        one("c", "m", [5.0], 429, "rate_limited"),  # the client's: not counted
    ]


def exposition(*, multiprocess: bool) -> bytes:
    registry = CollectorRegistry(auto_describe=True)
    counters = SliCounters(registry, multiprocess=multiprocess)
    snapshot = (
        SnapshotBuilder()
        .add_class("c", band=0, ttft_slo_ms=100, itl_slo_ms=20)
        .add_class("b", band=1, ttft_slo_ms=5)
        .snapshot()
    )
    for record in records():
        counters.observe(record, snapshot)
    counters.observe(records()[0], None)  # no snapshot: availability and the stream only
    return generate_latest(registry)


@pytest.mark.parametrize("created", [True, False])
def test_the_same_exposition_as_prometheus_counters(
    monkeypatch: pytest.MonkeyPatch, created: bool
) -> None:
    monkeypatch.setattr("time.time", lambda: 1_796_000_000.25)  # every series' _created
    monkeypatch.setattr(prometheus_metrics, "_use_created", created)
    plain = exposition(multiprocess=False)
    assert plain == exposition(multiprocess=True)
    assert b'switchyard_sli_good_total{class="c",model="m",sli="itl"} 1.0' in plain
    assert (b"switchyard_sli_events_created" in plain) is created


def test_a_second_registration_of_the_names_is_refused() -> None:
    registry = CollectorRegistry(auto_describe=True)
    SliCounters(registry, multiprocess=False)
    with pytest.raises(ValueError, match="Duplicated timeseries"):
        SliCounters(registry, multiprocess=True)
