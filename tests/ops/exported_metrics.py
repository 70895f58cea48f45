"""The metric names a router exports, read from a live RouterMetrics registry.

Every collector is attached with one sample view, so series that only exist at scrape time
(queues, fleet, snapshot) are included. Histograms export ``_bucket``/``_sum``/``_count``,
counters ``_total`` (and ``_created``).
"""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from runtime.telemetry.collectors import EndpointView
from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.metrics import PoolView, RouterMetrics, StageLabels
from runtime.telemetry.resume_metrics import ResumeMetrics


class _Snapshot:
    version = 3
    stale = False
    stale_after_s = 120.0

    def age_s(self) -> float:
        return 1.0


def exported_metric_names() -> set[str]:
    metrics = RouterMetrics()
    metrics.attach_scheduling(
        lambda: [
            PoolView(
                pool="cpu",
                queued={0: 1},
                served_tokens={"acme": (1, 2)},
                served_share={"acme": 1.0},
                entitled_share={"acme": 1.0},
                counters={(0, "acme"): 1.0},
                over=frozenset({"acme", "flood"}),
                over_limit=8,
                flooding=frozenset({"flood"}),
                flood_limit=2,
            )
        ]
    )
    metrics.attach_snapshot(_Snapshot())
    metrics.attach_fleet(
        lambda: [
            EndpointView(
                endpoint=1, pool="cpu", up=True, breaker_open=False, kv_usage=0.5, waiting=1.0
            )
        ]
    )
    metrics.attach_admission(lambda: False)
    labels = StageLabels(model="m", version="v1", endpoint="1", klass="c")
    metrics.observe("e2e", 0.1, labels)
    metrics.queue_wait.labels("cpu", "0").observe(0.1)
    metrics.count(model="m", klass="c", outcome="ok", tenant="acme")
    metrics.reject("shed")
    metrics.retries_total.labels("m").inc()
    metrics.inflight.labels("1").inc()
    resumes = ResumeMetrics(metrics.registry)  # as runtime/gateway/state.py creates it
    resumes.outcome(cause="migration", reason="disconnected", outcome="resumed")
    resumes.resumed(cause="migration", reprefilled=3, seconds=0.2)
    resumes.preempted(reason="lent_slot")
    record = RequestRecord(request_id="r", route="/v1/chat/completions", status=200, outcome="ok")
    record.timings_ms = {"upstream_ttft": 1.0, "e2e": 2.0}
    metrics.observe_slis(record, None)
    text = metrics.render()[0].decode()
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }
