"""The dispatcher over the real fleet signals: a simulator's scraped gauges hold requests."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest
from dispatch_support import ticket
from fixtures.router import Process, World, start_simulator
from fixtures.wait import async_eventually

from runtime.routing.inflight import InFlight
from runtime.routing.signals import FleetSignals
from runtime.routing.table import RoutingTable
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.placement import FleetPlacement
from runtime.scheduling.settings import PoolSettings
from runtime.upstream.breaker import BreakerBook
from runtime.upstream.client import UpstreamClient
from runtime.upstream.health import HealthConfig, HealthMonitor

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

MODEL = "gauge-chat"


@pytest.fixture(scope="module")
def engine() -> Iterator[Process]:
    # One running sequence at a time, 20 ms per token: a second request waits in the engine.
    # (The placement forgives a waiting request sent less than 0.25 s before the scrape.)
    process = start_simulator(MODEL, "--max-num-seqs", "1", "--decode-a-ms", "20")
    yield process
    process.stop()


def queueing_since(health: HealthMonitor, when: float) -> bool:
    """A scrape after ``when`` saw requests waiting in the engine (not just on their way in)."""
    status = health.status(1)
    return (
        status is not None
        and bool(status.waiting)
        and status.last_scrape is not None
        and status.last_scrape > when
    )


async def test_engine_waiting_gauge_holds_requests_although_inflight_has_room(
    engine: Process,
) -> None:
    world = World()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, engine.base_url, pool="p", capacity=4)  # the router thinks 4
    snapshot = world.snapshot()
    client = UpstreamClient()
    health = HealthMonitor(client, HealthConfig(interval_s=0.05))
    health.set_endpoints(snapshot.endpoints.values())
    inflight = InFlight()
    loop = asyncio.get_running_loop()
    placement = FleetPlacement(
        "p", snapshot=lambda: snapshot, table=RoutingTable(), health=health, inflight=inflight,
        signals=FleetSignals(breakers=BreakerBook(), health=health, inflight=inflight),
        clock=loop.time,
    )  # fmt: skip
    dispatcher = PoolDispatcher("p", PoolSettings(), placement, clock=loop.time, tick_s=0.01)
    dispatcher.start()
    await health.start()
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 40}  # 0.8 s each
    try:
        async with httpx.AsyncClient(base_url=engine.base_url, timeout=30) as http:
            grants = [await dispatcher.acquire(ticket()) for _ in range(2)]
            assert inflight.get(1) == 2
            sent = [asyncio.create_task(http.post("/v1/completions", json=body)) for _ in grants]
            sent_at = loop.time()
            await async_eventually(  # a scrape sees the engine still queueing one
                lambda: queueing_since(health, sent_at + 0.35), timeout=5, interval=0.01
            )
            third = asyncio.create_task(dispatcher.acquire(ticket()))
            await asyncio.sleep(0.05)  # a negative check: it must stay queued
            assert not third.done()  # 2 in flight < capacity 4, but the engine queues
            for grant, request in zip(grants, sent, strict=True):
                assert (await request).status_code == 200
                grant.release()
            grant = await asyncio.wait_for(third, 5)  # the queue drained: released
            assert grant.endpoint is not None
            grant.release()
            assert inflight.get(1) == 0
    finally:
        await dispatcher.stop()
        await health.stop()
        await client.close()
