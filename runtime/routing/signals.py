"""Routing signals from the upstream layer: breakers, health probes, in-flight counts."""

from __future__ import annotations

from runtime.routing.inflight import InFlight
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
