"""Prometheus metrics of one router process, in a registry of its own.

- ``switchyard_stage_seconds{stage, model, version, endpoint, class}``: a histogram per
  request stage — ``auth`` (key check), ``queue`` (ready to dispatch → endpoint chosen),
  ``upstream_ttft`` (dispatch → first upstream event, streams only: a unary answer's first
  byte is the whole answer, timed by ``e2e``), ``inter_token`` (gap between two
  streamed events) and ``e2e`` (request received → response finished);
- ``switchyard_requests_total{model, class, outcome, tenant}``: requests by outcome
  (``ok`` or an error code such as ``invalid_api_key``);
- ``switchyard_inflight_requests{endpoint}``: requests the router has in flight per endpoint;
- ``switchyard_upstream_retries_total{model}``: attempts beyond the first;
- ``switchyard_queue_wait_seconds{pool, band}``: time from admission into a pool queue to
  the release to an endpoint;
- ``switchyard_rejections_total{reason}``: requests refused or dropped before an engine, by
  reason (``rate_limit_exceeded``, ``tokens_per_minute_exceeded``,
  ``concurrency_limit_exceeded``, ``queue_full``, ``wait_exceeds_deadline``, ``shed``,
  ``deadline_exceeded``, ``no_healthy_endpoint``);
- ``switchyard_degraded_total{action, reason}``: requests degraded instead of queued long
  (action ``cap_tokens`` / ``fallback``; reason ``queue_wait``, ``breaker_open``,
  ``no_endpoint``: :mod:`runtime.degradation`);
- read from the dispatchers at scrape time (:meth:`RouterMetrics.attach_scheduling`):
  ``switchyard_queue_length{pool, band}``, ``switchyard_served_tokens_total{pool, tenant,
  kind}`` (kind ``input`` / ``output``), ``switchyard_tenant_share{pool, tenant, kind}``
  (kind ``served`` / ``entitled``: the recent share of service of the contending tenants next
  to the share their weights entitle them to), ``switchyard_fairness_jain_index{pool}`` (Jain's
  index over their weight-normalised service) and ``switchyard_fairness_counter{pool, band,
  tenant}`` (the fairness policy's counters, shared across replicas);
- read from the snapshot loader at scrape time (:meth:`RouterMetrics.attach_snapshot`):
  ``switchyard_snapshot_version``, ``switchyard_snapshot_age_seconds`` (since the snapshot in
  force was last known to match the database), ``switchyard_snapshot_stale`` (1 when that age
  is over the router's bound, ``switchyard_snapshot_stale_after_seconds``);
- read from health checks and breakers at scrape time (:meth:`RouterMetrics.attach_fleet`):
  ``switchyard_endpoint_up{endpoint, pool}``, ``switchyard_endpoint_breaker_open{endpoint,
  pool}``, ``switchyard_endpoint_kv_cache_usage{endpoint, pool}`` (0..1) and
  ``switchyard_endpoint_requests_waiting{endpoint, pool}`` (the engine's own queue);
- ``switchyard_sli_events_total`` / ``switchyard_sli_good_total{sli, class, model}``: the
  SLI counters (:mod:`runtime.telemetry.slis`);
- read from the LoRA residency book at scrape time (:meth:`RouterMetrics.attach_adapters`):
  ``switchyard_adapter_*{endpoint}``, loads, evictions, waits, load time, resident and active
  adapters (:mod:`runtime.telemetry.adapter_metrics`).

Several worker processes (``python -m runtime.gateway --workers N``): with
``PROMETHEUS_MULTIPROC_DIR`` set (the launcher sets and cleans one per router), the counters,
histograms and the in-flight gauge live in prometheus_client's per-process files and
``/metrics`` sums them over every worker, whichever worker answers the scrape; the scrape-time
views (queues, fairness, fleet, snapshot) are those of the answering worker.

Label values come from the snapshot (or a fixed vocabulary), never from raw client input, so
series stay bounded; the tenant label keeps the first ``max_tenant_labels`` tenants seen and
folds the rest into ``other``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector

from runtime.snapshot import Snapshot
from runtime.telemetry.adapter_metrics import AdapterCollector, AdapterCounters, AdapterRows
from runtime.telemetry.children import Children
from runtime.telemetry.collectors import (
    AdmissionCollector,
    EndpointViews,
    FleetCollector,
    SnapshotCollector,
    SnapshotStatus,
)
from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.slis import SliCounters

STAGES: Final = ("auth", "queue", "upstream_ttft", "inter_token", "e2e")
# Millisecond-scale resolution at the low end (auth, queue), seconds at the top (e2e).
STAGE_BUCKETS: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    120.0,
)
OTHER: Final = "other"


class BoundedLabel:
    """Maps an open set of values onto at most ``limit`` distinct labels plus ``other``."""

    __slots__ = ("_limit", "_seen")

    def __init__(self, limit: int) -> None:
        if limit < 0:
            raise ValueError("limit must be >= 0")
        self._limit = limit
        self._seen: set[str] = set()

    def __call__(self, value: str) -> str:
        if not value or value in self._seen:  # "" (not known yet) costs no slot
            return value
        if len(self._seen) < self._limit:
            self._seen.add(value)
            return value
        return OTHER


class StageLabels:
    """The label values shared by every stage of one request."""

    __slots__ = ("endpoint", "klass", "model", "version")

    def __init__(
        self, *, model: str = "", version: str = "", endpoint: str = "", klass: str = ""
    ) -> None:
        self.model = model
        self.version = version
        self.endpoint = endpoint
        self.klass = klass

    def values(self, stage: str) -> tuple[str, str, str, str, str]:
        return (stage, self.model, self.version, self.endpoint, self.klass)


@dataclass(frozen=True, slots=True)
class PoolView:
    """What one pool's dispatcher reports at scrape time (plain data)."""

    pool: str
    queued: Mapping[int, int] = field(default_factory=dict)  # band -> requests queued
    served_tokens: Mapping[str, tuple[int, int]] = field(default_factory=dict)  # in, out
    served_share: Mapping[str, float] = field(default_factory=dict)
    entitled_share: Mapping[str, float] = field(default_factory=dict)
    counters: Mapping[tuple[int, str], float] = field(default_factory=dict)
    jain: float = 1.0
    # The headroom gate (runtime.scheduling.headroom): tenants held back and their limits.
    over: frozenset[str] = frozenset()  # over their share (flooders included): they yield
    over_limit: int = 0  # slots the over tenants may hold together
    flooding: frozenset[str] = frozenset()
    flood_limit: int = 0  # slots the flooding tenants may hold together


PoolViews = Callable[[], Iterable[PoolView]]


class _SchedulingCollector(Collector):
    def __init__(self, views: PoolViews, tenant_label: BoundedLabel) -> None:
        self._views = views
        self._tenant = tenant_label

    def collect(self) -> Iterator[Metric]:
        queue = GaugeMetricFamily(
            "switchyard_queue_length", "Requests waiting in a pool queue.", labels=["pool", "band"]
        )
        served = CounterMetricFamily(
            "switchyard_served_tokens",
            "Tokens served per tenant (input at dispatch, output as streamed).",
            labels=["pool", "tenant", "kind"],
        )
        share = GaugeMetricFamily(
            "switchyard_tenant_share",
            "Recent share of service of the contending tenants (served) and the share their "
            "weights entitle them to (entitled).",
            labels=["pool", "tenant", "kind"],
        )
        jain = GaugeMetricFamily(
            "switchyard_fairness_jain_index",
            "Jain's index over the contending tenants' weight-normalised recent service.",
            labels=["pool"],
        )
        counter = GaugeMetricFamily(
            "switchyard_fairness_counter",
            "Fairness counter (weighted tokens) per tenant and band, shared across replicas.",
            labels=["pool", "band", "tenant"],
        )
        held, limits = self._gate_families()
        for view in self._views():
            self._add_gate(view, held, limits)
            for band, length in sorted(view.queued.items()):
                queue.add_metric([view.pool, str(band)], length)
            tokens: dict[str, list[int]] = {}
            for tenant, (inp, out) in view.served_tokens.items():
                total = tokens.setdefault(self._tenant(tenant), [0, 0])
                total[0] += inp
                total[1] += out
            for tenant, (inp, out) in sorted(tokens.items()):
                served.add_metric([view.pool, tenant, "input"], inp)
                served.add_metric([view.pool, tenant, "output"], out)
            for kind, values in (("served", view.served_share), ("entitled", view.entitled_share)):
                folded: dict[str, float] = {}
                for tenant, value in values.items():
                    label = self._tenant(tenant)
                    folded[label] = folded.get(label, 0.0) + value
                for tenant, value in sorted(folded.items()):
                    share.add_metric([view.pool, tenant, kind], value)
            jain.add_metric([view.pool], view.jain)
            for (band, tenant), value in sorted(view.counters.items()):
                label = self._tenant(tenant)
                if label != OTHER:
                    counter.add_metric([view.pool, str(band), label], value)
        yield from (queue, served, share, jain, counter, held, limits)

    @staticmethod
    def _gate_families() -> tuple[GaugeMetricFamily, GaugeMetricFamily]:
        held = GaugeMetricFamily(
            "switchyard_tenant_held_back",
            "1 for a tenant the headroom gate holds back now: rule over_share (past its share "
            "and its burst credit: it yields to the others) or flooding (asking for more than "
            "twice its share on average: held to what the others' recent peak leaves).",
            labels=["pool", "tenant", "rule"],
        )
        limits = GaugeMetricFamily(
            "switchyard_headroom_limit_slots",
            "Slots the tenants held back may hold together, per group (over_share, flooding); "
            "only while the gate holds someone back.",
            labels=["pool", "group"],
        )
        return held, limits

    def _add_gate(self, view: PoolView, held: GaugeMetricFamily, limits: GaugeMetricFamily) -> None:
        if not view.over:
            return
        limits.add_metric([view.pool, "over_share"], view.over_limit)
        if view.flooding:
            limits.add_metric([view.pool, "flooding"], view.flood_limit)
        rules: dict[tuple[str, str], float] = {}
        for tenant in view.over:
            rule = "flooding" if tenant in view.flooding else "over_share"
            rules[(self._tenant(tenant), rule)] = 1.0
        for (tenant, rule), value in sorted(rules.items()):
            held.add_metric([view.pool, tenant, rule], value)


class RouterMetrics:
    """Every metric the router exports; create one per process (in the ASGI lifespan)."""

    def __init__(self, *, max_tenant_labels: int = 50) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._multiprocess_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None
        self._views: list[Collector] = []  # scrape-time collectors (this process's state)
        self.tenant_label = BoundedLabel(max_tenant_labels)
        self.stage_seconds = Histogram(
            "switchyard_stage_seconds",
            "Time spent per request stage (auth, queue, upstream_ttft, inter_token, e2e).",
            ["stage", "model", "version", "endpoint", "class"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.requests_total = Counter(
            "switchyard_requests",
            "Requests answered by the router, by outcome ('ok' or an error code).",
            ["model", "class", "outcome", "tenant"],
            registry=self.registry,
        )
        self.inflight = Gauge(
            "switchyard_inflight_requests",
            "Requests this router has in flight, per endpoint.",
            ["endpoint"],
            registry=self.registry,
            multiprocess_mode="livesum",  # summed over the live workers
        )
        self.retries_total = Counter(
            "switchyard_upstream_retries",
            "Upstream attempts beyond the first (before the first byte).",
            ["model"],
            registry=self.registry,
        )

        self.queue_wait = Histogram(
            "switchyard_queue_wait_seconds",
            "Time from admission into a pool queue to the release to an endpoint.",
            ["pool", "band"],
            buckets=STAGE_BUCKETS,
            registry=self.registry,
        )
        self.rejections_total = Counter(
            "switchyard_rejections",
            "Requests refused or dropped before reaching an engine, by reason.",
            ["reason"],
            registry=self.registry,
        )
        self.degraded_total = Counter(
            "switchyard_degraded",
            "Requests degraded before admission, by action and reason (runtime.degradation).",
            ["action", "reason"],
            registry=self.registry,
        )
        self._scheduling: _SchedulingCollector | None = None
        self._adapter_counters: AdapterCounters | None = None
        self.slis = SliCounters(self.registry, multiprocess=self._multiprocess_dir is not None)
        self._stages = Children(self.stage_seconds)
        self._requests = Children(self.requests_total)
        self._inflight: dict[int, Gauge] = {}  # endpoint id -> its child (ids are bounded)
        self._queue_waits = Children(self.queue_wait)

    def attach_scheduling(self, views: PoolViews) -> None:
        """Export the dispatchers' state, read from ``views()`` at every scrape."""
        if self._scheduling is not None:
            self.registry.unregister(self._scheduling)
            self._views.remove(self._scheduling)
        self._scheduling = _SchedulingCollector(views, self.tenant_label)
        self._register_view(self._scheduling)

    def attach_snapshot(self, status: SnapshotStatus) -> None:
        """Export the snapshot's version, age and staleness, read at every scrape."""
        self._register_view(SnapshotCollector(status))

    def attach_fleet(self, views: EndpointViews) -> None:
        """Export each endpoint's health, breaker and engine gauges, read at every scrape."""
        self._register_view(FleetCollector(views))

    def attach_adapters(self, rows: AdapterRows) -> None:
        """Export the LoRA residency book's counters (:mod:`.adapter_metrics`): read at every
        scrape; with several workers, copied into the per-process files (:meth:`sync_adapters`)."""
        if self._multiprocess_dir is None:
            self._register_view(AdapterCollector(rows))
        else:
            self._adapter_counters = AdapterCounters(self.registry, rows)

    def sync_adapters(self) -> None:
        """With several workers: this worker's adapter counts into its metric files (called
        at every adapter heartbeat poll and before a scrape this worker answers)."""
        if self._adapter_counters is not None:
            self._adapter_counters.sync()

    def attach_admission(self, degraded: Callable[[], bool]) -> None:
        """Export whether admission runs on its Redis-down fallback, read at every scrape."""
        self._register_view(AdmissionCollector(degraded))

    def _register_view(self, collector: Collector) -> None:
        self.registry.register(collector)
        self._views.append(collector)

    def observe_slis(self, record: RequestRecord, snapshot: Snapshot | None) -> None:
        """Count one finished request toward the SLIs (:mod:`runtime.telemetry.slis`)."""
        self.slis.observe(record, snapshot)

    def reject(self, reason: str) -> None:
        self.rejections_total.labels(reason).inc()

    def observe(self, stage: str, seconds: float, labels: StageLabels) -> None:
        self.stage_observer(stage, labels).observe(max(seconds, 0.0))

    def stage_observer(self, stage: str, labels: StageLabels) -> Histogram:
        """The labelled child for ``stage`` (fetch once, observe many: inter-token gaps)."""
        return self._stages(*labels.values(stage))

    def count(self, *, model: str, klass: str, outcome: str, tenant: str) -> None:
        self._requests(model, klass, outcome, self.tenant_label(tenant)).inc()

    def observe_queue_wait(self, pool: str, band: int, seconds: float) -> None:
        """``switchyard_queue_wait_seconds{pool, band}``."""
        self._queue_waits(pool, str(band)).observe(seconds)

    def inflight_delta(self, endpoint_id: int, delta: int) -> None:
        """Move ``switchyard_inflight_requests{endpoint}`` by ``delta``."""
        child = self._inflight.get(endpoint_id)
        if child is None:
            child = self._inflight[endpoint_id] = self.inflight.labels(str(endpoint_id))
        child.inc(delta)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, for ``GET /metrics``."""
        if self._multiprocess_dir is None:
            return generate_latest(self.registry), CONTENT_TYPE_LATEST
        self.sync_adapters()
        registry = CollectorRegistry()  # every worker's files, then this worker's views
        MultiProcessCollector(registry, path=self._multiprocess_dir)  # type: ignore[no-untyped-call]
        for view in self._views:
            registry.register(view)
        return generate_latest(registry), CONTENT_TYPE_LATEST
