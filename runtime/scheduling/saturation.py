"""Saturation detectors: may one more request be released to this endpoint now?

The router's own in-flight count is the immediate signal (it moves the instant a request is
dispatched); the engine's scraped metrics arrive every few hundred milliseconds and say what
the in-flight count cannot: the KV cache is nearly full, or the engine already queues.
"""

from __future__ import annotations

from typing import ClassVar

from runtime.scheduling.interfaces import EndpointLoad


class InflightOnly:
    """Room while the router's in-flight count is below the endpoint's capacity."""

    name: ClassVar[str] = "inflight_only"

    __slots__ = ()

    def has_room(self, *, inflight: int, capacity: int, metrics: EndpointLoad) -> bool:
        return inflight < capacity


class VllmMetrics:
    """In-flight below capacity, KV-cache use below ``kv_threshold``, and nothing waiting.

    ``vllm:kv_cache_usage_perc`` at or above the threshold, or any
    ``vllm:num_requests_waiting``, means the engine would queue or preempt: the router keeps
    the request so priority and fairness decide what enters the batch. Metrics older than
    ``stale_after_s`` (or never scraped) are ignored and the in-flight count alone decides,
    so a slow scrape cannot stall a pool.
    """

    name: ClassVar[str] = "vllm_metrics"

    __slots__ = ("kv_threshold", "stale_after_s")

    def __init__(self, *, kv_threshold: float = 0.9, stale_after_s: float = 1.0) -> None:
        if not 0 < kv_threshold <= 1:
            raise ValueError(f"kv_threshold must be in (0, 1], got {kv_threshold!r}")
        if not stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0, got {stale_after_s!r}")
        self.kv_threshold = kv_threshold
        self.stale_after_s = stale_after_s

    def has_room(self, *, inflight: int, capacity: int, metrics: EndpointLoad) -> bool:
        if inflight >= capacity:
            return False
        if metrics.age_s is None or metrics.age_s > self.stale_after_s:
            return True
        if metrics.kv_usage is not None and metrics.kv_usage >= self.kv_threshold:
            return False
        return not (metrics.waiting is not None and metrics.waiting > 0)
