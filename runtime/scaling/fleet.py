"""The router's view of a pool's replicas for the scaling signals (read once per interval)."""

from __future__ import annotations

from collections.abc import Callable

from runtime.routing.endpoints import EndpointSignals
from runtime.snapshot import EndpointSnap, Snapshot


class SnapshotFleet:
    """Implements :class:`runtime.scaling.publisher.PoolFleet` over the snapshot in force and the
    fleet signals: ready endpoints that are healthy with a closed breaker count."""

    def __init__(self, snapshot: Callable[[], Snapshot | None], signals: EndpointSignals) -> None:
        self._snapshot = snapshot
        self._signals = signals

    def _usable(self, pool: str) -> list[EndpointSnap]:
        snapshot = self._snapshot()
        if snapshot is None:
            return []
        return [
            e
            for e in snapshot.endpoints.values()
            if e.pool == pool
            and e.state == "ready"
            and self._signals.healthy(e.id)
            and self._signals.breaker_available(e.id)
        ]

    def capacity(self, pool: str) -> int:
        return sum(e.capacity for e in self._usable(pool))

    def ready(self, pool: str) -> int:
        return len(self._usable(pool))

    def kv_usage(self, pool: str) -> float | None:
        values = [v for e in self._usable(pool) if (v := self._signals.kv_usage(e.id)) is not None]
        return max(values) if values else None
