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
from collections.abc import Sequence
from typing import Final, NamedTuple

from prometheus_client import CollectorRegistry, Counter

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


class SliCounters:
    """The two SLI counters, in the router's registry."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.events = Counter(
            "switchyard_sli_events",
            "Events counted toward a service-level indicator (see runtime/telemetry/slis.py).",
            ["sli", "class", "model"],
            registry=registry,
        )
        self.good = Counter(
            "switchyard_sli_good",
            "Events that met the indicator's objective.",
            ["sli", "class", "model"],
            registry=registry,
        )
        # (class, model) -> the children of each SLI in SliVerdict's field order, events then
        # good; each made on its first count (a series appears once it counts something).
        self._rows: dict[tuple[str, str], list[Counter | None]] = {}

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
