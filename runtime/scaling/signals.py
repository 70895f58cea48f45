"""A pool's scaling signals: what one router measured over its last interval, and the sum over
routers that the controller reads.

One router publishes one :class:`PoolSignals` per pool it has a dispatcher for (see
:mod:`runtime.scaling.publisher`); :func:`aggregate` merges the routers' entries: counts and
rates add up, queue-wait and TTFT p95, the TTFT/SLO ratio, KV use, batch fill and batch compute
time take the worst router, capacity and ready endpoints are
the fleet's (every router sees the same snapshot, so the largest value is the current one).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import msgspec


class PoolSignals(msgspec.Struct, frozen=True, kw_only=True):
    pool: str
    at: float  # unix time of the measurement
    interval_s: float = 1.0
    routers: int = 1
    queued: dict[str, int] = msgspec.field(default_factory=dict)  # band -> requests waiting
    wait_p95_s: dict[str, float] = msgspec.field(default_factory=dict)  # band -> queue wait
    dispatched_per_s: float = 0.0
    deadline_miss_per_s: float = 0.0  # expired in the queue or refused for the deadline
    shed_per_s: float = 0.0  # shed or refused because the queue was full
    inflight: int = 0
    capacity: int = 0  # concurrent sequences of the pool's usable endpoints
    ready: int = 0  # usable endpoints the router sees
    kv_usage: float | None = None  # highest KV-cache use scraped from the pool's engines
    # Time to first token (router queue + upstream first byte) of the interval's streams: p95
    # per request class; and the worst p95 / objective (> 1: over it) over the streams' TTFT
    # against their class's TTFT SLO and the unary requests' e2e against its deadline.
    ttft_p95_s: dict[str, float] = msgspec.field(default_factory=dict)
    ttft_slo_ratio: float = 0.0
    # Encoder (CPU) pools, from their batchers' /metrics: mean batch fill (size / cap) and
    # mean seconds computing one batch over the interval; None without a batch.
    batch_fill: float | None = None
    batch_compute_s: float | None = None

    @property
    def queued_total(self) -> int:
        return sum(self.queued.values())

    @property
    def utilisation(self) -> float:
        """In-flight over capacity (queued work counts as demand); inf with demand and no
        capacity, 0 with neither."""
        demand = self.inflight + self.queued_total
        if self.capacity <= 0:
            return math.inf if demand > 0 else 0.0
        return demand / self.capacity

    @property
    def idle(self) -> bool:
        return self.inflight == 0 and self.queued_total == 0 and self.dispatched_per_s == 0


def p95(values: Sequence[float]) -> float:
    """The 95th percentile (nearest rank) of ``values``; 0 for none."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]


def aggregate(pool: str, entries: Iterable[PoolSignals]) -> PoolSignals:
    """The fleet-wide signals of ``pool`` from its routers' entries (none: an idle pool)."""
    items = list(entries)
    if not items:
        return PoolSignals(pool=pool, at=0.0, routers=0)
    queued: dict[str, int] = {}
    waits: dict[str, float] = {}
    for item in items:
        for band, n in item.queued.items():
            queued[band] = queued.get(band, 0) + n
        for band, w in item.wait_p95_s.items():
            waits[band] = max(waits.get(band, 0.0), w)
    kvs = [i.kv_usage for i in items if i.kv_usage is not None]
    ttfts: dict[str, float] = {}
    for item in items:
        for klass, t in item.ttft_p95_s.items():
            ttfts[klass] = max(ttfts.get(klass, 0.0), t)
    return PoolSignals(
        pool=pool,
        at=max(i.at for i in items),
        interval_s=max(i.interval_s for i in items),
        routers=len(items),
        queued=queued,
        wait_p95_s=waits,
        dispatched_per_s=sum(i.dispatched_per_s for i in items),
        deadline_miss_per_s=sum(i.deadline_miss_per_s for i in items),
        shed_per_s=sum(i.shed_per_s for i in items),
        inflight=sum(i.inflight for i in items),
        capacity=max(i.capacity for i in items),
        ready=max(i.ready for i in items),
        kv_usage=max(kvs) if kvs else None,
        ttft_p95_s=ttfts,
        ttft_slo_ratio=max(i.ttft_slo_ratio for i in items),
        batch_fill=_worst(i.batch_fill for i in items),
        batch_compute_s=_worst(i.batch_compute_s for i in items),
    )


def _worst(values: Iterable[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return max(known) if known else None


def encode(signals: PoolSignals) -> bytes:
    return msgspec.json.encode(signals)


def decode(raw: bytes | str) -> PoolSignals:
    return msgspec.json.decode(raw, type=PoolSignals)
