"""Observing many values into a Prometheus histogram at once (the relay's inter-token gaps):
one bisect per value, then one increment per bucket hit and one of the sum, where
``observe`` takes a lock per value twice and scans the buckets linearly."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from prometheus_client import Histogram


def observe_many(histogram: Histogram, values: Sequence[float], *, scale: float = 1.0) -> None:
    """``histogram.observe(v * scale)`` for each of ``values``, with the same result.

    Reads prometheus_client's child internals (``_upper_bounds``, ``_buckets``, ``_sum``);
    a version without them gets one ``observe`` per value."""
    bounds = getattr(histogram, "_upper_bounds", None)
    buckets = getattr(histogram, "_buckets", None)
    total = getattr(histogram, "_sum", None)
    if bounds is None or buckets is None or total is None:
        for value in values:
            histogram.observe(value * scale)
        return
    hits: dict[int, int] = {}
    amount = 0.0
    for value in values:
        scaled = value * scale
        amount += scaled
        index = bisect_left(bounds, scaled)  # the first bound >= value, as observe picks
        hits[index] = hits.get(index, 0) + 1
    for index, count in hits.items():
        buckets[index].inc(count)
    total.inc(amount)
