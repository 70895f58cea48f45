"""Fairness counters shared by two dispatchers (two routers) through one Redis."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis
from dispatch_support import HandFleet, settle, ticket, waiting
from fixtures.wait import async_eventually

from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.settings import PoolSettings
from runtime.scheduling.shared import SharedCounters

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest_asyncio.fixture
async def prefix() -> AsyncIterator[str]:
    name = f"switchyard:test:fairness:{uuid.uuid4().hex[:10]}"
    yield name
    client = redis.Redis.from_url(redis_url())
    keys = list(client.scan_iter(match=f"{name}:*"))
    if keys:
        client.delete(*keys)
    client.close()


async def router(prefix: str, url: str | None = None) -> tuple[PoolDispatcher, SharedCounters]:
    shared = SharedCounters(url or redis_url(), prefix=prefix, interval_s=0.02,
                            idle_interval_s=0.05)  # fmt: skip
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    loop = asyncio.get_running_loop()
    # No headroom: with four requests each for one slot, both tenants would flood
    # (runtime.scheduling.headroom); these tests are about the shared counters alone.
    settings = PoolSettings(fairness="vtc", headroom=0.0)
    dispatcher = PoolDispatcher("p", settings, fleet, clock=loop.time, tick_s=0.01, sink=shared)
    shared.attach("p", dispatcher)
    dispatcher.start()
    await shared.start()
    return dispatcher, shared


async def grant_order(two: PoolDispatcher, serve_elsewhere: PoolDispatcher | None) -> list[str]:
    """Tenants a and b both backlogged on router two (one slot); before each release, tenant a
    is served on ``serve_elsewhere`` (router one) too. The order router two serves them in."""
    busy = await two.acquire(ticket("c"))
    tasks = []
    for _ in range(4):
        for tenant in ("a", "b"):
            tasks.append((tenant, waiting(two, ticket(tenant))))
            await settle()
    order: list[str] = []
    held = busy
    for _ in range(len(tasks)):
        if serve_elsewhere is not None:
            elsewhere = await serve_elsewhere.acquire(ticket("a", tokens=1000, output=0))
            elsewhere.release()
        await asyncio.sleep(0.12)  # a few sync rounds (the scenario: counters shared meanwhile)
        held.release()
        await settle()
        granted = [(t, task) for t, task in tasks if task.done()]
        assert len(granted) == 1
        tenant, task = granted[0]
        tasks.remove((tenant, task))
        order.append(tenant)
        held = task.result()
    held.release()
    return order


async def test_service_on_one_router_counts_on_the_other(prefix: str) -> None:
    one, one_sync = await router(prefix)
    two, two_sync = await router(prefix)
    try:
        # Router one also charges streamed output, in many small steps: batched syncs.
        grant = await one.acquire(ticket("a", tokens=10, output=500))
        for _ in range(50):
            grant.charge_output(10)
        grant.release()
        order = await grant_order(two, one)
        assert one_sync.syncs <= 60  # ~10 per 0.12 s wait at most; never one per charge
        # a is served elsewhere all along: b takes router two's slot until the queue is empty.
        assert order[:5].count("b") == 4, order
    finally:
        for d, s in ((one, one_sync), (two, two_sync)):
            await d.stop()
            await s.stop()


async def test_without_sharing_the_two_tenants_alternate(prefix: str) -> None:
    two, two_sync = await router(f"{prefix}:isolated")
    try:
        order = await grant_order(two, None)
        assert order == ["a", "b"] * 4, order
    finally:
        await two.stop()
        await two_sync.stop()


async def test_redis_down_keeps_fairness_local_and_logs_once(
    prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with caplog.at_level(logging.WARNING, logger="runtime.scheduling.shared"):
        d, shared = await router(prefix, f"redis://127.0.0.1:{port}/0")
        try:
            grant = await d.acquire(ticket("a", tokens=100))
            grant.release()
            await async_eventually(  # the background sync tried and logged
                lambda: [r for r in caplog.records if "unreachable" in r.getMessage()],
                timeout=5, what="the unreachable warning",
            )  # fmt: skip
            assert not await shared.sync_once(force=True)
            assert d.counters() == {(0, "a"): 100.0}
        finally:
            await d.stop()
            await shared.stop()
    assert len([r for r in caplog.records if "unreachable" in r.getMessage()]) == 1


async def test_an_idle_router_dozes_until_the_slow_beat_and_a_charge_wakes_it(
    prefix: str,
) -> None:
    shared = SharedCounters(redis_url(), prefix=prefix, interval_s=0.01, idle_interval_s=2.0)
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    loop = asyncio.get_running_loop()
    d = PoolDispatcher("p", PoolSettings(), fleet, clock=loop.time, tick_s=0.01, sink=shared)
    shared.attach("p", d)
    d.start()
    await shared.start()
    try:
        await async_eventually(lambda: shared.syncs >= 1, timeout=5, what="the first slow beat")
        before = shared.wakeups
        await asyncio.sleep(0.3)  # nothing contended, nothing charged: no wake-up due
        assert shared.wakeups - before <= 1
        grant = await d.acquire(ticket("a", tokens=100))  # a charge: the fast beat at once
        grant.release()
        woken = shared.wakeups
        await async_eventually(lambda: shared.wakeups > woken, timeout=0.5,
                               what="a wake-up soon after a charge")  # fmt: skip
        # the charge goes out on the slow beat, as before
        client = redis.Redis.from_url(redis_url())
        try:
            await async_eventually(lambda: client.hget(shared.key("p"), "0|a") is not None,
                                   timeout=5, what="the charge in Redis")  # fmt: skip
        finally:
            client.close()
        after = shared.wakeups
        await asyncio.sleep(0.3)  # no charge, no contention since: back to dozing
        assert shared.wakeups - after <= 2  # the fast beat's last one and a slow beat
    finally:
        await d.stop()
        await shared.stop()


async def test_without_pools_the_sync_task_sleeps_the_slow_beat(prefix: str) -> None:
    shared = SharedCounters(redis_url(), prefix=prefix, interval_s=0.01, idle_interval_s=0.5)
    await shared.start()
    try:
        await asyncio.sleep(0.3)  # no pool attached, nothing charged: nothing to wake for
        assert shared.wakeups <= 1
        assert shared.syncs == 0
    finally:
        await shared.stop()


class _SwallowingPipeline:
    """A pipeline whose round trip never ends and, cancelled, raises a connection error: what
    redis-py's asyncio client can do with a cancellation that lands mid-read."""

    def __init__(self, entered: asyncio.Event) -> None:
        self.entered = entered

    def __getattr__(self, name: str) -> object:
        return lambda *args, **kwargs: self  # hincrbyfloat, expire, hgetall: queued

    async def execute(self) -> list[object]:
        self.entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            raise redis.exceptions.ConnectionError("Connection closed by server.") from None
        return []


class _SwallowingClient:
    def __init__(self) -> None:
        self.entered = asyncio.Event()

    def pipeline(self, transaction: bool = False) -> _SwallowingPipeline:
        return _SwallowingPipeline(self.entered)

    async def aclose(self) -> None:
        return None


async def test_stop_ends_the_sync_task_when_redis_swallows_its_cancellation(prefix: str) -> None:
    """A stop that lands in a round trip redis-py turns into an error still ends the task
    (it went back to dozing, and the router's shutdown waited on it for ever)."""
    shared = SharedCounters(redis_url(), prefix=prefix, interval_s=0.01, idle_interval_s=0.05)
    await shared.start()
    real = shared._client
    client = _SwallowingClient()
    shared._client = client  # type: ignore[assignment]
    try:
        shared.record("p", 0, "a", 1.0)  # a charge: a round trip is due
        async with asyncio.timeout(5):
            await client.entered.wait()
        async with asyncio.timeout(5):  # the old stop() waited here for ever
            await shared.stop()
        assert shared._task is None
    finally:
        if real is not None:
            await real.aclose()  # type: ignore[attr-defined]
