"""The router's signals publisher against real Redis: rates from counter deltas, one hash
field per router, stale entries left out, read back and summed."""

from __future__ import annotations

import os
import uuid
from collections import Counter, deque
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
import redis.asyncio as aioredis

from runtime.contract import scaling_signals_key
from runtime.scaling.publisher import PoolMeter, SignalsPublisher, parse_entries
from runtime.scaling.signals import aggregate

pytestmark = pytest.mark.asyncio
REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


class Pool:
    """A test double of the dispatcher's metered side (runtime.scaling.publisher.MeteredPool)."""

    def __init__(self) -> None:
        self.pool = "gpu-a"
        self.outcomes: Counter[str] = Counter()
        self.waits: dict[int, deque[float]] = {}
        self.queued: dict[int, int] = {}
        self.running: dict[str, int] = {}

    def queue_lengths(self) -> dict[int, int]:
        return self.queued

    def inflight(self) -> dict[str, int]:
        return self.running


class Fleet:
    def capacity(self, pool: str) -> int:
        return 16

    def ready(self, pool: str) -> int:
        return 2

    def kv_usage(self, pool: str) -> float | None:
        return 0.5


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest_asyncio.fixture
async def ns() -> AsyncIterator[str]:
    namespace = f"switchyard:test:signals:{uuid.uuid4().hex[:8]}"
    yield namespace
    client = aioredis.Redis.from_url(REDIS_URL)
    await client.delete(scaling_signals_key(namespace, "gpu-a"))
    await client.aclose()


async def test_publishes_rates_and_waits_and_reads_back_summed(ns: str) -> None:
    pool, clock = Pool(), Clock()
    meter = PoolMeter(Fleet(), clock=clock)
    pubs = [
        SignalsPublisher(
            REDIS_URL, namespace=ns, pools=lambda: [pool], meter=meter, router_id=name
        )
        for name in ("r1", "r2")
    ]
    try:
        assert await pubs[0].publish_once() == 1  # the first reading: no rates yet
        pool.outcomes.update({"dispatched": 20, "deadline_expired": 2, "shed": 1, "queue_full": 1})
        pool.waits[1] = deque([0.1] * 19 + [2.0])
        pool.queued = {1: 3, 0: 0}
        pool.running = {"t1": 4, "t2": 2}
        clock.now += 2.0
        await pubs[1].publish_once()
        client = aioredis.Redis.from_url(REDIS_URL)
        raw = await client.hgetall(scaling_signals_key(ns, "gpu-a"))
        ttl = await client.ttl(scaling_signals_key(ns, "gpu-a"))
        await client.aclose()
        assert set(raw) == {b"r1", b"r2"}
        assert 0 < ttl <= 5
        entries = parse_entries(raw, now=clock.now, stale_s=10)
        total = aggregate("gpu-a", entries)
        assert total.routers == 2
        assert total.dispatched_per_s == pytest.approx(10.0)
        assert total.deadline_miss_per_s == pytest.approx(1.0)
        assert total.shed_per_s == pytest.approx(1.0)
        assert total.queued == {"1": 3}
        assert total.inflight == 6
        assert total.wait_p95_s == {"1": 0.1}  # nearest rank 19 of 20
        assert (total.capacity, total.ready, total.kv_usage) == (16, 2, 0.5)
        assert parse_entries(raw, now=clock.now + 100, stale_s=10) == []
        assert parse_entries({b"x": b"not json"}, now=0, stale_s=1) == []
    finally:
        for pub in pubs:
            await pub.stop()


async def test_a_publisher_without_redis_keeps_running(ns: str) -> None:
    pub = SignalsPublisher("redis://127.0.0.1:1/0", namespace=ns, pools=lambda: [Pool()],
                           meter=PoolMeter(Fleet()), interval_s=0.05)  # fmt: skip
    with pytest.raises(Exception, match=r"[Cc]onnect"):
        await pub.publish_once()
    pub.start()
    from fixtures.wait import async_eventually  # noqa: PLC0415

    await async_eventually(lambda: pub._task is not None and not pub._task.done(), timeout=2,
                           what="the publisher loop survives a Redis error")  # fmt: skip
    await pub.stop()
