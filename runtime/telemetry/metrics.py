"""Prometheus metrics of one router process, in a registry of its own.

- ``switchyard_stage_seconds{stage, model, version, endpoint, class}``: a histogram per
  request stage — ``auth`` (key check), ``queue`` (ready to dispatch → endpoint chosen),
  ``upstream_ttft`` (dispatch → first upstream event), ``inter_token`` (gap between two
  streamed events) and ``e2e`` (request received → response finished);
- ``switchyard_requests_total{model, class, outcome, tenant}``: requests by outcome
  (``ok`` or an error code such as ``invalid_api_key``);
- ``switchyard_inflight_requests{endpoint}``: requests the router has in flight per endpoint;
- ``switchyard_upstream_retries_total{model}``: attempts beyond the first.

Label values come from the snapshot (or a fixed vocabulary), never from raw client input, so
series stay bounded; the tenant label keeps the first ``max_tenant_labels`` tenants seen and
folds the rest into ``other``.
"""

from __future__ import annotations

from typing import Final

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

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


class RouterMetrics:
    """Every metric the router exports; create one per process (in the ASGI lifespan)."""

    def __init__(self, *, max_tenant_labels: int = 50) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
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
        )
        self.retries_total = Counter(
            "switchyard_upstream_retries",
            "Upstream attempts beyond the first (before the first byte).",
            ["model"],
            registry=self.registry,
        )

    def observe(self, stage: str, seconds: float, labels: StageLabels) -> None:
        self.stage_seconds.labels(*labels.values(stage)).observe(max(seconds, 0.0))

    def stage_observer(self, stage: str, labels: StageLabels) -> Histogram:
        """The labelled child for ``stage`` (fetch once, observe many: inter-token gaps)."""
        return self.stage_seconds.labels(*labels.values(stage))

    def count(self, *, model: str, klass: str, outcome: str, tenant: str) -> None:
        self.requests_total.labels(model, klass, outcome, self.tenant_label(tenant)).inc()

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type, for ``GET /metrics``."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
