"""A labelled metric's children, made on first use and kept.

prometheus_client's ``metric.labels(*values)`` validates the values and takes a lock on every
call; on the request path a metric is asked for the same few series over and over. The label
values here come from the snapshot (models, classes, endpoints, pools), so the map stays
bounded, like the metric's own series.
"""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge, Histogram

M = TypeVar("M", Counter, Gauge, Histogram)


class Children(Generic[M]):
    """``children(*values)`` is ``metric.labels(*values)``, looked up once per series."""

    __slots__ = ("_made", "_metric")

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._made: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._made.get(values)
        if child is None:
            child = self._made[values] = self._metric.labels(*values)
        return child
