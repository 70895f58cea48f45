"""LoRA adapter metrics, read at scrape time from the router's residency book.

Per endpoint (the router's own counts: several routers in front of one replica each count
the loads they made):

- ``switchyard_adapter_loads_total{endpoint}``: adapters this router loaded there;
- ``switchyard_adapter_evictions_total{endpoint}``: adapters it unloaded to free a slot;
- ``switchyard_adapter_load_waits_total{endpoint}``: requests that waited for a load another
  request had started (single flight);
- ``switchyard_adapter_hits_total{endpoint}``: requests whose adapter was already resident;
- ``switchyard_adapter_load_seconds{endpoint}`` (a summary: ``_sum`` / ``_count``): the time
  ``/v1/load_lora_adapter`` took;
- ``switchyard_adapter_resident{endpoint}``: adapters resident there, its own loads and those
  the replica's heartbeat reports;
- ``switchyard_adapter_active{endpoint}``: distinct adapters its requests in flight there use
  (against the pool's ``max_loras``).

With several worker processes (``PROMETHEUS_MULTIPROC_DIR`` set) each worker keeps its own
book, so a scrape-time view would answer with whichever worker took the scrape, and the counters
would go up and down between scrapes. There :class:`AdapterCounters` copies each worker's book
into prometheus_client's per-process files instead (at every heartbeat poll and before a scrape
it answers): the counters and the summary are summed over the workers, the two gauges are the
largest any live worker reports (each worker's book sees the heartbeats' residency and its own
loads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Summary
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector


@dataclass(frozen=True, slots=True, kw_only=True)
class AdapterRow:
    """One endpoint's adapter counters, as the router's residency book holds them."""

    endpoint: int
    loads: int
    evictions: int
    waited: int
    hits: int
    load_s_total: float
    resident: int
    active: int


AdapterRows = Callable[[], Iterable[AdapterRow]]


class AdapterCollector(Collector):
    def __init__(self, rows: AdapterRows) -> None:
        self._rows = rows

    def collect(self) -> Iterator[Metric]:
        labels = ["endpoint"]

        def counter(name: str, doc: str) -> CounterMetricFamily:
            return CounterMetricFamily(f"switchyard_adapter_{name}", doc, labels=labels)

        loads = counter("loads", "LoRA adapters this router loaded on the endpoint.")
        evictions = counter("evictions", "LoRA adapters this router unloaded to free a slot.")
        waits = counter("load_waits", "Requests that waited for another request's adapter load.")
        hits = counter("hits", "Requests whose LoRA adapter was already resident.")
        seconds = SummaryMetricFamily(
            "switchyard_adapter_load_seconds",
            "Time the engine's /v1/load_lora_adapter took.",
            labels=labels,
        )
        resident = GaugeMetricFamily(
            "switchyard_adapter_resident",
            "LoRA adapters resident on the endpoint (own loads and its heartbeat's).",
            labels=labels,
        )
        active = GaugeMetricFamily(
            "switchyard_adapter_active",
            "Distinct LoRA adapters of this router's requests in flight on the endpoint.",
            labels=labels,
        )
        for row in self._rows():
            values = [str(row.endpoint)]
            loads.add_metric(values, row.loads)
            evictions.add_metric(values, row.evictions)
            waits.add_metric(values, row.waited)
            hits.add_metric(values, row.hits)
            seconds.add_metric(values, count_value=row.loads, sum_value=row.load_s_total)
            resident.add_metric(values, row.resident)
            active.add_metric(values, row.active)
        yield from (loads, evictions, waits, hits, seconds, resident, active)


class AdapterCounters:
    """The book's counters as this process's prometheus_client metrics, moved by the deltas
    since the last :meth:`sync` (several worker processes: module docstring)."""

    def __init__(self, registry: CollectorRegistry, rows: AdapterRows) -> None:
        self._rows = rows
        self._last: dict[int, AdapterRow] = {}
        labels = ["endpoint"]

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"switchyard_adapter_{name}", doc, labels, registry=registry)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"switchyard_adapter_{name}", doc, labels, registry=registry,
                         multiprocess_mode="livemax")  # fmt: skip

        self._loads = counter("loads", "LoRA adapters this router loaded on the endpoint.")
        self._evictions = counter("evictions", "LoRA adapters this router unloaded to free a slot.")
        self._waits = counter("load_waits", "Requests that waited for another request's load.")
        self._hits = counter("hits", "Requests whose LoRA adapter was already resident.")
        self._seconds = Summary("switchyard_adapter_load_seconds",
                                "Time the engine's /v1/load_lora_adapter took.", labels,
                                registry=registry)  # fmt: skip
        self._resident = gauge("resident", "LoRA adapters resident on the endpoint.")
        self._active = gauge("active", "Distinct LoRA adapters of requests in flight there.")

    def sync(self) -> None:
        """Add what the book counted since the last call; set the gauges."""
        for row in self._rows():
            label = str(row.endpoint)
            last = self._last.get(row.endpoint)
            loads = row.loads - (last.loads if last else 0)
            for metric, delta in (
                (self._loads, loads),
                (self._evictions, row.evictions - (last.evictions if last else 0)),
                (self._waits, row.waited - (last.waited if last else 0)),
                (self._hits, row.hits - (last.hits if last else 0)),
            ):
                if delta > 0:
                    metric.labels(label).inc(delta)
            if loads > 0:  # count += loads, sum += the new load seconds, exactly
                each = (row.load_s_total - (last.load_s_total if last else 0.0)) / loads
                for _ in range(loads):
                    self._seconds.labels(label).observe(each)
            self._resident.labels(label).set(row.resident)
            self._active.labels(label).set(row.active)
            self._last[row.endpoint] = row
