"""Service-level indicators as counters: good and total events per SLI, class and model.

- ``switchyard_sli_events_total{sli, class, model}`` and ``switchyard_sli_good_total{...}``,
  for ``sli`` in:

  - ``availability``: every request answered, except intentional 4xx (the client's own errors,
    authentication, limits, shedding: the platform chose them) and client disconnects; good
    when it succeeded (a stream broken after its first byte is not good);
  - ``ttft``: streams that reached a first token; good when queue wait + upstream first
    token took at most the class's ``ttft_slo_ms`` (a unary request's "first byte" is its
    whole answer: it is judged by ``e2e`` alone);
  - ``itl``: streams with at least two events; good when the p95 of their gaps between
    events (inter-token latency) is at most the class's ``itl_slo_ms``;
  - ``e2e``: successful requests; good when they finished within the class's ``deadline_ms``
    (the end-to-end objective a class states);
  - ``stream_completion``: streams that started; good when they ended with a finish reason,
    not with the terminal error event (client disconnects are left out).

The objectives (99 %, 99.9 %, ...) and their error budgets live with the alert rules in
``platform/prometheus/``; the router only counts. Ratios over windows come from recording
rules there. Label values come from the snapshot (class and model names), so series stay
bounded.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Sequence
from typing import Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter
from prometheus_client import metrics as prometheus_metrics
from prometheus_client.metrics_core import CounterMetricFamily

from runtime.snapshot import Snapshot
from runtime.telemetry.logging import RequestRecord

SLIS: Final = ("availability", "ttft", "itl", "e2e", "stream_completion")
_NOT_THE_PLATFORM: Final = frozenset({"client_disconnected"})


class SliVerdict(NamedTuple):
    """Which SLIs one request counts toward (None: not counted) and whether it was good."""

    availability: bool | None
    ttft: bool | None
    e2e: bool | None
    stream_completion: bool | None
    itl: bool | None = None

    def items(self) -> tuple[tuple[str, bool | None], ...]:
        return (
            ("availability", self.availability),
            ("ttft", self.ttft),
            ("itl", self.itl),
            ("e2e", self.e2e),
            ("stream_completion", self.stream_completion),
        )


def p95_ms(gaps: Sequence[float]) -> float:
    """The nearest-rank 95th percentile of ``gaps`` (not empty)."""
    ordered = sorted(gaps)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def judge(
    record: RequestRecord,
    *,
    ttft_slo_ms: float | None,
    e2e_slo_ms: float | None,
    itl_slo_ms: float | None = None,
) -> SliVerdict:
    """The SLI verdicts of one finished request (pure: unit-tested on its own)."""
    if record.outcome in _NOT_THE_PLATFORM or 400 <= record.status < 500:
        return SliVerdict(None, None, None, None)
    ok = record.status < 400 and record.outcome == "ok"
    timings = record.timings_ms
    first = timings.get("upstream_ttft")
    streamed = record.stream and first is not None
    ttft: bool | None = None
    if streamed and first is not None and ttft_slo_ms is not None:
        ttft = first + timings.get("queue", 0.0) <= ttft_slo_ms
    itl: bool | None = None
    if streamed and record.itl_ms and itl_slo_ms is not None:
        itl = p95_ms(record.itl_ms) <= itl_slo_ms
    e2e: bool | None = None
    if ok and e2e_slo_ms is not None and "e2e" in timings:
        e2e = timings["e2e"] <= e2e_slo_ms
    return SliVerdict(
        availability=ok, ttft=ttft, e2e=e2e, stream_completion=ok if streamed else None, itl=itl
    )


class _Cell:
    """One series' count and when it was made (a plain counter child: no lock, no checks)."""

    __slots__ = ("created", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.created = time.time()

    def inc(self) -> None:
        self.value += 1.0


class _PlainCounter:
    """A labelled counter kept as plain numbers and exported by :class:`SliCounters` at a
    scrape: the same family, series, order, values and ``_created`` samples as
    prometheus_client's ``Counter`` (its children are made on first use too)."""

    def __init__(self, name: str, documentation: str, labelnames: Sequence[str]) -> None:
        self.name = name
        self.documentation = documentation
        self.labelnames = tuple(labelnames)
        self.cells: dict[tuple[str, ...], _Cell] = {}

    def labels(self, *values: str) -> _Cell:
        key = tuple(str(value) for value in values)
        cell = self.cells.get(key)
        if cell is None:
            cell = self.cells[key] = _Cell()
        return cell

    def family(self) -> CounterMetricFamily:
        family = CounterMetricFamily(self.name, self.documentation, labels=self.labelnames)
        created = prometheus_metrics._use_created  # PROMETHEUS_DISABLE_CREATED_SERIES
        for key, cell in list(self.cells.items()):
            family.add_metric(key, cell.value, cell.created if created else None)
        return family


_EVENTS = (
    "switchyard_sli_events",
    "Events counted toward a service-level indicator (see runtime/telemetry/slis.py).",
)
_GOOD = ("switchyard_sli_good", "Events that met the indicator's objective.")
_LABELS = ("sli", "class", "model")


class SliCounters:
    """The two SLI counters, in the router's registry.

    In one process they are plain numbers, exported by this collector at a scrape (ten
    prometheus_client ``Counter.inc`` per request, each a lock and two checks, cost more than
    the rest of the count; issue #27); the exposition is the same. With several workers
    (``multiprocess``: ``PROMETHEUS_MULTIPROC_DIR`` set) they are prometheus_client counters,
    whose values the per-process files carry to whichever worker is scraped.
    """

    def __init__(self, registry: CollectorRegistry, *, multiprocess: bool | None = None) -> None:
        if multiprocess is None:
            multiprocess = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
        self.events: Counter | _PlainCounter
        self.good: Counter | _PlainCounter
        if multiprocess:
            self.events = Counter(*_EVENTS, _LABELS, registry=registry)
            self.good = Counter(*_GOOD, _LABELS, registry=registry)
        else:
            self.events = _PlainCounter(*_EVENTS, _LABELS)
            self.good = _PlainCounter(*_GOOD, _LABELS)
            registry.register(self)
        # (class, model) -> the children of each SLI in SliVerdict's field order, events then
        # good; each made on its first count (a series appears once it counts something).
        self._rows: dict[tuple[str, str], list[Counter | _Cell | None]] = {}

    def describe(self) -> list[CounterMetricFamily]:
        """The families' names, for the registry's duplicate check (plain counters only)."""
        return [CounterMetricFamily(*_EVENTS), CounterMetricFamily(*_GOOD)]

    def collect(self) -> list[CounterMetricFamily]:
        """The plain counters' families, at a scrape."""
        if isinstance(self.events, _PlainCounter) and isinstance(self.good, _PlainCounter):
            return [self.events.family(), self.good.family()]
        return []

    def observe(self, record: RequestRecord, snapshot: Snapshot | None) -> None:
        """Count one finished request (``record.klass``/``record.model`` name the series)."""
        klass = None if snapshot is None else snapshot.classes.get(record.klass)
        verdict = judge(
            record,
            ttft_slo_ms=None if klass is None else klass.ttft_slo_ms,
            e2e_slo_ms=None if klass is None else klass.deadline_ms,
            itl_slo_ms=None if klass is None else klass.itl_slo_ms,
        )
        series = (record.klass, record.model)
        row = self._rows.get(series)
        if row is None:
            row = self._rows[series] = [None] * (2 * len(SliVerdict._fields))
        for index, good in enumerate(verdict):
            if good is None:
                continue
            events = row[2 * index]
            if events is None:
                events = row[2 * index] = self.events.labels(SliVerdict._fields[index], *series)
            events.inc()
            if good:
                kept = row[2 * index + 1]
                if kept is None:
                    kept = row[2 * index + 1] = self.good.labels(SliVerdict._fields[index], *series)
                kept.inc()
