"""FleetSignals over the real breakers and health monitor."""

from __future__ import annotations

import socket

import pytest

from runtime.routing.inflight import InFlight
from runtime.routing.signals import FleetSignals
from runtime.testing.snapshots import endpoint_snap
from runtime.upstream.breaker import BreakerBook, BreakerConfig
from runtime.upstream.client import UpstreamClient
from runtime.upstream.health import HealthConfig, HealthMonitor

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_signals_follow_breakers_health_and_inflight() -> None:
    client = UpstreamClient()
    breakers = BreakerBook(BreakerConfig(failure_threshold=1, cooldown_s=60))
    health = HealthMonitor(client, HealthConfig(unhealthy_after=1, probe_timeout_s=0.5))
    inflight = InFlight()
    signals = FleetSignals(breakers=breakers, health=health, inflight=inflight)
    ep = endpoint_snap(1, 1, f"http://127.0.0.1:{closed_port()}", pool="p", capacity=1)
    try:
        assert signals.healthy(1)  # unknown to the monitor
        health.set_endpoints([ep])
        assert signals.healthy(1)  # known, never probed yet: optimistic
        await health.check_once(1)
        assert not signals.healthy(1)
        assert signals.breaker_available(1)
        breakers.get(1).record_failure()
        assert not signals.breaker_available(1)
        inflight.acquire(1)
        assert signals.inflight(1) == 1
    finally:
        await health.stop()
        await client.close()
