"""The cache's Prometheus series, in the router's registry.

- ``switchyard_cache_lookups_total{level, result}``: lookups by level (``l1`` / ``l2``) and
  result (``hit`` / ``miss``);
- ``switchyard_cache_evictions_total{level}``: L2 entries evicted to fit a tenant quota
- ``switchyard_cache_stored_bytes_total``: bytes written to L2;
- ``switchyard_cache_l1_entries`` / ``switchyard_cache_l1_capacity``: L1 occupancy;
- ``switchyard_cache_flight_joins_total{where}``: requests that waited for another's answer
  (``local``: the same router; ``remote``: a lease held by another router);
- ``switchyard_cache_idempotent_replays_total``;
- ``switchyard_cache_unreadable_total``: L2 entries or idempotency records that did not open
  (sealed with a key the keyring no longer holds, or altered): read as absent.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class CacheMetrics:
    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.lookups = Counter("switchyard_cache_lookups_total", "Cache lookups by level.",
                               ["level", "result"], registry=registry)  # fmt: skip
        self.evictions = Counter("switchyard_cache_evictions_total", "Cache evictions.",
                                 ["level"], registry=registry)  # fmt: skip
        self.stored_bytes = Counter(
            "switchyard_cache_stored_bytes_total",
            "Bytes written to the L2 cache.",
            registry=registry,
        )
        self.l1_entries = Gauge("switchyard_cache_l1_entries", "Entries in L1.", registry=registry)
        self.l1_slots = Gauge("switchyard_cache_l1_capacity", "L1 capacity in entries.",
                              registry=registry)  # fmt: skip
        self.joins = Counter("switchyard_cache_flight_joins_total", "Single-flight joins.",
                             ["where"], registry=registry)  # fmt: skip
        self.replays = Counter("switchyard_cache_idempotent_replays_total",
                               "Idempotent replays.", registry=registry)  # fmt: skip
        self.unreadable = Counter("switchyard_cache_unreadable_total",
                                  "Stored entries that did not decrypt (read as absent).",
                                  registry=registry)  # fmt: skip

    def l1_capacity(self, slots: int, size: Callable[[], int]) -> None:
        self.l1_slots.set(slots)
        self.l1_entries.set_function(size)

    def lookup(self, level: str, *, hit: bool) -> None:
        self.lookups.labels(level, "hit" if hit else "miss").inc()

    def stored(self, size: int, *, evicted: int) -> None:
        self.stored_bytes.inc(size)
        if evicted:
            self.evictions.labels("l2").inc(evicted)
