"""Routing signals from the upstream layer: breakers, health probes, in-flight counts."""

from __future__ import annotations

from runtime.routing.adapters import AdapterSignal, ResidencyBook
from runtime.routing.endpoints import EndpointSignals
from runtime.routing.inflight import InFlight
from runtime.routing.prefix import PrefixMatch
from runtime.snapshot import EndpointSnap, Snapshot
from runtime.upstream.breaker import BreakerBook
from runtime.upstream.health import HealthMonitor


class FleetSignals:
    """Implements :class:`runtime.routing.endpoints.EndpointSignals` over live router state.

    An endpoint the health monitor has not finished probing yet (no success and no failure
    so far) counts as healthy: a fresh endpoint or a fresh router must not answer 503 for the
    first probe interval; a failing one is caught by its breaker and by the next probe.
    """

    __slots__ = ("_breakers", "_health", "_inflight")

    def __init__(self, *, breakers: BreakerBook, health: HealthMonitor, inflight: InFlight) -> None:
        self._breakers = breakers
        self._health = health
        self._inflight = inflight

    def breaker_available(self, endpoint_id: int) -> bool:
        return self._breakers.available(endpoint_id)

    def healthy(self, endpoint_id: int) -> bool:
        status = self._health.status(endpoint_id)
        if status is None or status.healthy:
            return True
        # Never probed yet: no success and no failure so far.
        return (
            status.last_scrape is None
            and status.last_health is None
            and status.consecutive_failures == 0
            and status.health_failures == 0
        )

    def inflight(self, endpoint_id: int) -> int:
        return self._inflight.get(endpoint_id)

    def kv_usage(self, endpoint_id: int) -> float | None:
        status = self._health.status(endpoint_id)
        return None if status is None else status.kv_usage

    def cost_per_hour(self, endpoint: EndpointSnap) -> float | None:
        return None  # the snapshot knows it: see RequestSignals

    def affinity_key(self) -> str | None:
        return None

    def cached_prefix(self, endpoint_id: int) -> float | None:
        return None  # a request's: see RequestSignals

    def adapter(self, endpoint_id: int) -> AdapterSignal | None:
        return None  # a request's: see RequestSignals


class RequestSignals:
    """The fleet's signals plus what one request adds: its prompt-prefix key, its prefix
    match against the router's prefix index, the LoRA adapter it names (with the router's
    residency book), and the pool costs of the snapshot it is routed with."""

    __slots__ = ("_adapter", "_affinity_key", "_fleet", "_prefix", "_residency", "_snapshot")

    def __init__(
        self,
        fleet: EndpointSignals,
        snapshot: Snapshot,
        affinity_key: str | None = None,
        prefix: PrefixMatch | None = None,
        *,
        adapter: str | None = None,
        residency: ResidencyBook | None = None,
    ) -> None:
        self._fleet = fleet
        self._snapshot = snapshot
        self._affinity_key = affinity_key
        self._prefix = prefix
        self._adapter = adapter
        self._residency = residency

    def breaker_available(self, endpoint_id: int) -> bool:
        return self._fleet.breaker_available(endpoint_id)

    def healthy(self, endpoint_id: int) -> bool:
        return self._fleet.healthy(endpoint_id)

    def inflight(self, endpoint_id: int) -> int:
        return self._fleet.inflight(endpoint_id)

    def kv_usage(self, endpoint_id: int) -> float | None:
        return self._fleet.kv_usage(endpoint_id)

    def cost_per_hour(self, endpoint: EndpointSnap) -> float | None:
        pool = self._snapshot.pools.get(endpoint.pool)
        return None if pool is None else pool.cost_per_replica_hour

    def affinity_key(self) -> str | None:
        return self._affinity_key

    def cached_prefix(self, endpoint_id: int) -> float | None:
        if self._prefix is None or self._prefix.blocks <= 0:
            return None
        return self._prefix.fraction(endpoint_id)

    def adapter(self, endpoint_id: int) -> AdapterSignal | None:
        if self._adapter is None or self._residency is None:
            return None
        return self._residency.adapter_signal(endpoint_id, self._adapter)
