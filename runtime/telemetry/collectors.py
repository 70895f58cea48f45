"""Collectors read at scrape time: the snapshot's freshness, the fleet's endpoints and whether
admission runs on its Redis-down fallback."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Protocol

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector


class SnapshotStatus(Protocol):
    """What ``/metrics`` reads from the snapshot loader (``SnapshotLoader``)."""

    @property
    def version(self) -> int | None: ...

    @property
    def stale(self) -> bool: ...

    stale_after_s: float

    def age_s(self) -> float | None: ...


class SnapshotCollector(Collector):
    def __init__(self, status: SnapshotStatus) -> None:
        self._status = status

    def collect(self) -> Iterator[Metric]:
        status = self._status
        version = status.version
        age = status.age_s()
        yield GaugeMetricFamily(
            "switchyard_snapshot_version",
            "Version of the runtime snapshot in force (0: none loaded).",
            value=version or 0,
        )
        yield GaugeMetricFamily(
            "switchyard_snapshot_age_seconds",
            "Seconds since the snapshot in force was last known to match the database "
            "(its build, or the control plane's later confirmation); -1 when none is loaded.",
            value=-1.0 if age is None else age,
        )
        yield GaugeMetricFamily(
            "switchyard_snapshot_stale",
            "1 when the snapshot in force is older than the router's staleness bound.",
            value=1.0 if status.stale else 0.0,
        )
        yield GaugeMetricFamily(
            "switchyard_snapshot_stale_after_seconds",
            "The router's staleness bound for its snapshot.",
            value=status.stale_after_s,
        )


class AdmissionCollector(Collector):
    """``switchyard_admission_redis_fallback``: 1 while this router admits on its local
    fallback limits and credit shares (Redis unreachable; ``RedisLimits.degraded``)."""

    def __init__(self, degraded: Callable[[], bool]) -> None:
        self._degraded = degraded

    def collect(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "switchyard_admission_redis_fallback",
            "1 while this router admits on its local fallback limits and credit shares "
            "(Redis unreachable), 0 on the shared Redis limits.",
            value=1.0 if self._degraded() else 0.0,
        )


@dataclass(frozen=True, slots=True)
class EndpointView:
    """What the router knows about one endpoint of its snapshot (plain data)."""

    endpoint: int
    pool: str
    up: bool
    breaker_open: bool
    kv_usage: float | None = None
    waiting: float | None = None


EndpointViews = Callable[[], Iterable[EndpointView]]


class FleetCollector(Collector):
    def __init__(self, views: EndpointViews) -> None:
        self._views = views

    def collect(self) -> Iterator[Metric]:
        labels = ["endpoint", "pool"]
        up = GaugeMetricFamily(
            "switchyard_endpoint_up",
            "1 when the endpoint's health checks pass (as this router sees it).",
            labels=labels,
        )
        breaker = GaugeMetricFamily(
            "switchyard_endpoint_breaker_open",
            "1 while this router's circuit breaker for the endpoint is open.",
            labels=labels,
        )
        kv = GaugeMetricFamily(
            "switchyard_endpoint_kv_cache_usage",
            "KV-cache usage of the endpoint's engine (0..1), from its last metrics scrape.",
            labels=labels,
        )
        waiting = GaugeMetricFamily(
            "switchyard_endpoint_requests_waiting",
            "Requests waiting inside the endpoint's engine, from its last metrics scrape.",
            labels=labels,
        )
        for view in self._views():
            values = [str(view.endpoint), view.pool]
            up.add_metric(values, 1.0 if view.up else 0.0)
            breaker.add_metric(values, 1.0 if view.breaker_open else 0.0)
            if view.kv_usage is not None:
                kv.add_metric(values, view.kv_usage)
            if view.waiting is not None:
                waiting.add_metric(values, view.waiting)
        yield from (up, breaker, kv, waiting)
