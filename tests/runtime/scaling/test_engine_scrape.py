"""EngineScraper's own fetch: encoder /metrics pages read through the upstream client's probe
(a real HTTP server), failures left out, and an injected client left open for its owner."""

from __future__ import annotations

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from prometheus_client import generate_latest

from runtime.scaling.engines import EngineReading, EngineScraper
from runtime.snapshot import Snapshot
from runtime.testing.snapshots import SnapshotBuilder
from runtime.upstream.client import UpstreamClient
from runtime.workers.encoder.batcher import Batch, Job
from runtime.workers.encoder.metrics import EncoderMetrics

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def page(batches: list[tuple[int, float]], max_batch: int = 8) -> str:
    metrics = EncoderMetrics("embed")
    for size, seconds in batches:
        jobs = tuple(Job(task="embed", ids=[1], deadline=0.0, enqueued=0.0) for _ in range(size))
        metrics.on_batch(Batch(task="embed", jobs=jobs, reason="size"), seconds, max_batch)
    return generate_latest(metrics.registry).decode()


def world(good: str, bad: str) -> Snapshot:
    builder = SnapshotBuilder()
    builder.add_model("embed", 2, task="embedding", runtime="torch")
    builder.add_endpoint(8, 2, good, pool="enc")
    builder.add_endpoint(9, 2, bad, pool="enc")
    return builder.snapshot()


async def test_pages_come_through_the_probe_and_failures_are_left_out() -> None:
    pages = {"good": page([(8, 0.1)]), "bad": "boom"}
    statuses = {"good": 200, "bad": 500}

    async def metrics(request: web.Request) -> web.Response:
        which = request.match_info["which"]
        return web.Response(text=pages[which], status=statuses[which])

    app = web.Application()
    app.router.add_get("/{which}/metrics", metrics)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    base = f"http://127.0.0.1:{server.port}"
    snapshot = world(f"{base}/good", f"{base}/bad")
    client = UpstreamClient()
    scraper = EngineScraper(lambda: snapshot, client=client)
    try:
        await scraper.refresh()  # first reading: totals only
        pages["good"] = page([(8, 0.1), (4, 0.3)])  # one more batch: fill 0.5, 0.3 s
        await scraper.refresh()
        reading = scraper.reading("enc")
        assert reading.batch_fill == pytest.approx(0.5)
        assert reading.batch_compute_s == pytest.approx(0.3)
        statuses["good"] = 503  # now neither answers 200: no reading
        await scraper.refresh()
        assert scraper.reading("enc") == EngineReading()
        await scraper.close()
        status, _ = await client.probe(base, "/good/metrics", timeout_s=2.0)  # still open
        assert status == 503
    finally:
        await client.close()
        await server.close()


async def test_without_a_client_it_opens_and_closes_its_own() -> None:
    current = [page([(2, 0.2)])]

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=current[0])

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    base = f"http://127.0.0.1:{server.port}"
    snapshot = world(base, "http://127.0.0.1:9")  # the second refuses connections
    scraper = EngineScraper(lambda: snapshot, timeout_s=2.0)
    try:
        await scraper.refresh()
        current[0] = page([(2, 0.2), (4, 0.4)])
        await scraper.refresh()
        reading = scraper.reading("enc")
        assert reading.batch_fill == pytest.approx(0.5)
        assert reading.batch_compute_s == pytest.approx(0.4)
    finally:
        await scraper.close()
        await server.close()
