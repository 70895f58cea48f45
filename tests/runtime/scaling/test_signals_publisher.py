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
from prometheus_client import generate_latest

from runtime.contract import scaling_signals_key
from runtime.scaling.engines import FILL, EngineReading, EngineScraper, histogram_totals
from runtime.scaling.publisher import PoolMeter, SignalsPublisher, parse_entries
from runtime.scaling.signals import aggregate
from runtime.snapshot import Snapshot
from runtime.telemetry.logging import RequestRecord
from runtime.testing.snapshots import SnapshotBuilder
from runtime.workers.encoder.batcher import Batch, Job
from runtime.workers.encoder.metrics import EncoderMetrics

pytestmark = pytest.mark.integration

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
        SignalsPublisher(REDIS_URL, namespace=ns, pools=lambda: [pool], meter=meter, router_id=name)
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


async def test_unchanged_signals_are_written_again_only_before_the_key_expires(ns: str) -> None:
    pool, clock = Pool(), Clock()
    pub = SignalsPublisher(REDIS_URL, namespace=ns, pools=lambda: [pool],
                           meter=PoolMeter(Fleet(), clock=clock), router_id="r1")  # fmt: skip
    client = aioredis.Redis.from_url(REDIS_URL)
    key = scaling_signals_key(ns, "gpu-a")

    async def written_at() -> float:
        [entry] = parse_entries(await client.hgetall(key), now=clock.now, stale_s=10)
        return entry.at

    try:
        assert await pub.publish_once() == 1
        first = await written_at()
        for _ in range(2):  # idle and unchanged: nothing written
            clock.now += 1.0
            assert await pub.publish_once() == 0
        assert await written_at() == first
        assert 0 < await client.ttl(key) <= 5  # still alive
        clock.now += 1.0
        assert await pub.publish_once() == 1  # the refresh, well before the key's expiry
        assert await written_at() == clock.now
        clock.now += 1.0
        pool.queued = {1: 2}  # a change: written at once
        assert await pub.publish_once() == 1
        [entry] = parse_entries(await client.hgetall(key), now=clock.now, stale_s=10)
        assert entry.queued == {"1": 2}
    finally:
        await client.aclose()
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


def world_snapshot() -> Snapshot:
    world = SnapshotBuilder()
    world.add_class("interactive", band=0, ttft_slo_ms=500)
    world.add_model("chat", 1, runtime="vllm")
    world.add_model("embed", 2, task="embedding", runtime="torch")
    world.add_endpoint(7, 1, "http://chat:1", pool="gpu-a")
    world.add_endpoint(8, 2, "http://embed:1", pool="enc")
    world.add_endpoint(9, 2, "http://embed:2", pool="enc")
    world.add_endpoint(10, 2, "http://embed:3", pool="enc", state="starting")
    return world.snapshot()


async def test_ttft_of_finished_requests_against_their_class_slo(ns: str) -> None:
    pool, clock = Pool(), Clock()
    pub = SignalsPublisher(REDIS_URL, namespace=ns, pools=lambda: [pool],
                           meter=PoolMeter(Fleet(), clock=clock), router_id="r1")  # fmt: skip
    snapshot = world_snapshot()

    def finished(ttft_ms: float | None, queue_ms: float, **fields: str) -> None:
        timings = {"queue": queue_ms, **({} if ttft_ms is None else {"upstream_ttft": ttft_ms})}
        values = {"endpoint": "7", "klass": "interactive", **fields}
        pub.observe_request(RequestRecord(request_id="x", route="/v1/chat/completions",
                                          stream=True, timings_ms=timings, **values),
                            snapshot)  # fmt: skip

    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        for _ in range(19):
            finished(100.0, 50.0)  # 0.15 s
        finished(300.0, 450.0)  # 0.75 s: the p95 (nearest rank 20 of 21)
        finished(300.0, 4500.0)  # 4.8 s: the slowest, above the p95
        finished(None, 9000.0)  # refused before a first byte: no TTFT
        finished(100.0, 9000.0, endpoint="")  # no endpoint
        finished(100.0, 9000.0, klass="unknown")
        await pub.publish_once()
        raw = await client.hgetall(scaling_signals_key(ns, "gpu-a"))
        signals = parse_entries(raw, now=clock.now, stale_s=10)[0]
        assert signals.ttft_p95_s == {"interactive": pytest.approx(0.75)}
        assert signals.ttft_slo_ratio == pytest.approx(1.5)
        clock.now += 1.0
        await pub.publish_once()  # a new interval without requests
        raw = await client.hgetall(scaling_signals_key(ns, "gpu-a"))
        signals = parse_entries(raw, now=clock.now, stale_s=10)[0]
        assert (signals.ttft_p95_s, signals.ttft_slo_ratio) == ({}, 0.0)
    finally:
        await client.aclose()
        await pub.stop()


async def test_unary_requests_count_end_to_end_against_the_deadline_not_as_ttft(ns: str) -> None:
    """Issue #33: a unary request's first byte is its whole answer; it feeds the latency
    ratio as e2e / deadline (so a unary-only pool is not blind), never the TTFT p95."""
    pool, clock = Pool(), Clock()
    pub = SignalsPublisher(REDIS_URL, namespace=ns, pools=lambda: [pool],
                           meter=PoolMeter(Fleet(), clock=clock), router_id="r1")  # fmt: skip
    snapshot = world_snapshot()
    deadline_s = snapshot.classes["interactive"].deadline_ms / 1000.0
    client = aioredis.Redis.from_url(REDIS_URL)
    try:
        for _ in range(20):  # 2 s to its first byte: far over a 1 s TTFT SLO, but unary
            timings = {"queue": 10.0, "upstream_ttft": 2000.0, "e2e": 1000.0 * deadline_s * 2}
            pub.observe_request(RequestRecord(request_id="u", route="/v1/embeddings",
                                              endpoint="7", klass="interactive",
                                              timings_ms=timings), snapshot)  # fmt: skip
        await pub.publish_once()
        raw = await client.hgetall(scaling_signals_key(ns, "gpu-a"))
        signals = parse_entries(raw, now=clock.now, stale_s=10)[0]
        assert signals.ttft_p95_s == {}
        assert signals.ttft_slo_ratio == pytest.approx(2.0)  # e2e p95 at twice the deadline
    finally:
        await client.aclose()
        await pub.stop()


def encoder_page(batches: list[tuple[int, float]], max_batch: int = 8) -> str:
    """A real encoder worker's exposition after ``batches`` of (size, compute seconds)."""
    metrics = EncoderMetrics("embed")
    for size, seconds in batches:
        jobs = tuple(Job(task="embed", ids=[1, 2], deadline=0.0, enqueued=0.0) for _ in range(size))
        metrics.on_batch(Batch(task="embed", jobs=jobs, reason="size"), seconds, max_batch)
    return generate_latest(metrics.registry).decode()


async def test_engine_scraper_reads_batch_fill_and_compute_of_ready_encoders() -> None:
    pages: dict[str, str | None] = {
        "http://embed:1": encoder_page([(8, 0.1)]),
        "http://embed:2": encoder_page([(2, 0.3)]),
    }
    fetched: list[str] = []

    async def fetch(base_url: str) -> str | None:
        fetched.append(base_url)
        return pages.get(base_url)

    scraper = EngineScraper(world_snapshot, fetch=fetch)
    await scraper.refresh()  # the first reading: totals only
    assert sorted(fetched) == ["http://embed:1", "http://embed:2"]  # not vLLM, not starting
    assert scraper.reading("enc") == EngineReading(None, None)
    pages["http://embed:1"] = encoder_page([(8, 0.1), (8, 0.1), (4, 0.3)])  # +1.0 and 0.5 fill
    pages["http://embed:2"] = encoder_page([(2, 0.3), (6, 0.2)])  # +0.75 fill
    await scraper.refresh()
    reading = scraper.reading("enc")
    assert reading.batch_fill == pytest.approx((1.0 + 0.5 + 0.75) / 3)
    assert reading.batch_compute_s == pytest.approx((0.1 + 0.3 + 0.2) / 3)
    pages["http://embed:2"] = None  # unreachable: left out, the other one counts
    await scraper.refresh()
    assert scraper.reading("enc") == EngineReading(None, None)  # no new batch on embed:1
    assert scraper.reading("gpu-a") == EngineReading()
    assert histogram_totals(encoder_page([(4, 0.5)]), FILL) == (0.5, 1.0)
    await scraper.close()
