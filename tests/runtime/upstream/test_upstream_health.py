"""HealthMonitor against live and killed simulators, and workers with odd answers."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace

import msgspec
import pytest
import pytest_asyncio
from aiohttp import web
from fixtures.wait import async_eventually

from runtime.upstream import (
    EndpointStatus,
    HealthConfig,
    HealthMonitor,
    UpstreamClient,
    UpstreamResponse,
)
from tests.runtime.upstream.conftest import SIM_MODEL, Simulator, endpoint

pytestmark = pytest.mark.integration

FAST = HealthConfig(interval_s=0.05, health_every=2, unhealthy_after=2, probe_timeout_s=0.5)


@pytest_asyncio.fixture
async def monitor(client: UpstreamClient) -> AsyncIterator[HealthMonitor]:
    m = HealthMonitor(client, FAST)
    yield m
    await m.stop()


async def wait_until(
    monitor: HealthMonitor,
    endpoint_id: int,
    check: Callable[[EndpointStatus], bool],
    *,
    within: float = 5.0,
) -> EndpointStatus:
    """Poll the monitor's status (bounded) until ``check`` holds; return that status."""

    def matched() -> EndpointStatus | None:
        status = monitor.status(endpoint_id)
        return status if status is not None and check(status) else None

    try:
        return await async_eventually(matched, timeout=within)
    except AssertionError:
        raise AssertionError(f"status never matched: {monitor.status(endpoint_id)}") from None


async def open_long_stream(client: UpstreamClient, sim: Simulator) -> UpstreamResponse:
    """A stream that stays open (or queued) far longer than the test."""
    body = json.dumps(
        {"model": SIM_MODEL, "prompt": "x" * 400, "max_tokens": 3000, "stream": True}
    ).encode()
    deadline = asyncio.get_running_loop().time() + 60
    return await client.open_stream(
        endpoint(1, sim.base_url), "/v1/completions", body, deadline=deadline
    )


@pytest.mark.integration
@pytest.mark.asyncio
async def test_reads_gauges_from_a_live_simulator_and_marks_a_killed_one_unhealthy(
    client: UpstreamClient, monitor: HealthMonitor, single_seq_simulator: Simulator
) -> None:
    sim = single_seq_simulator
    monitor.set_endpoints([endpoint(1, sim.base_url)])
    # unknown until probed: not healthy
    assert monitor.status(1) == EndpointStatus(endpoint_id=1, base_url=sim.base_url, healthy=False)
    await monitor.start()
    async with asyncio.timeout(30):
        idle = await wait_until(monitor, 1, lambda s: s.healthy)
        assert (idle.running, idle.waiting, idle.kv_usage) == (0, 0, 0)
        assert idle.last_scrape is not None
        assert idle.last_health is not None

        first = await open_long_stream(client, sim)  # runs (one sequence at a time)
        second = asyncio.create_task(open_long_stream(client, sim))  # waits in the queue
        busy = await wait_until(monitor, 1, lambda s: s.running == 1 and s.waiting == 1)
        assert busy.kv_usage is not None
        assert 0 < busy.kv_usage <= 1
        assert busy.healthy
        await first.aclose()
        second_resp = await second  # its first byte comes once the first one left
        await wait_until(monitor, 1, lambda s: s.running == 1 and s.waiting == 0)
        await second_resp.aclose()
        await wait_until(monitor, 1, lambda s: s.running == 0 and s.kv_usage == 0)

        sim.kill()
        loop = asyncio.get_running_loop()
        killed_at = loop.time()
        down = await wait_until(monitor, 1, lambda s: not s.healthy)
        assert loop.time() - killed_at < 2.0
        assert down.consecutive_failures >= FAST.unhealthy_after or down.health_failures >= 2
        assert down.last_error is not None
        # the last gauges stay readable, with the time they were scraped
        assert down.running == 0
        assert down.last_scrape is not None


Serve = Callable[[web.Application], Awaitable[str]]


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Serve]:
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


class FakeWorker:
    """A worker whose /health status and /metrics text the test sets."""

    def __init__(self) -> None:
        self.health_status = 200
        self.metrics_status = 200
        self.metrics = "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n"
        self.checks = 0  # /health requests answered
        self.scrapes = 0  # /metrics requests answered

    def app(self) -> web.Application:
        async def health(request: web.Request) -> web.Response:
            self.checks += 1
            return web.Response(status=self.health_status)

        async def metrics(request: web.Request) -> web.Response:
            self.scrapes += 1
            return web.Response(status=self.metrics_status, text=self.metrics)

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/metrics", metrics)
        return app


@pytest.mark.integration
@pytest.mark.asyncio
async def test_failing_health_marks_unhealthy_and_one_success_recovers(
    client: UpstreamClient, serve: Serve
) -> None:
    worker = FakeWorker()
    monitor = HealthMonitor(client, HealthConfig(unhealthy_after=2))
    monitor.set_endpoints([endpoint(3, await serve(worker.app()))])
    async with asyncio.timeout(10):
        assert (await monitor.check_once(3)).healthy
        worker.health_status = 503
        first = await monitor.check_once(3)
        assert first.healthy  # one failure is tolerated
        assert first.health_failures == 1
        assert first.last_error == "/health: HTTP 503"
        second = await monitor.check_once(3)
        assert not second.healthy
        assert second.consecutive_failures == 0  # /metrics itself is fine
        worker.health_status = 200
        assert (await monitor.check_once(3)).healthy


@pytest.mark.integration
@pytest.mark.asyncio
async def test_failing_metrics_marks_unhealthy(client: UpstreamClient, serve: Serve) -> None:
    worker = FakeWorker()
    monitor = HealthMonitor(client, HealthConfig(unhealthy_after=2))
    monitor.set_endpoints([endpoint(3, await serve(worker.app()))])
    async with asyncio.timeout(10):
        assert (await monitor.check_once(3)).healthy
        worker.metrics_status = 500
        await monitor.check_once(3, health=False)
        status = await monitor.check_once(3, health=False)
        assert not status.healthy
        assert status.consecutive_failures == 2
        assert status.running == 0  # the last good reading is kept
        worker.metrics_status = 200
        assert (await monitor.check_once(3, health=False)).healthy


@pytest.mark.integration
@pytest.mark.asyncio
async def test_worker_without_metrics_is_judged_by_health_alone(
    client: UpstreamClient, serve: Serve
) -> None:
    worker = FakeWorker()
    worker.metrics_status = 404
    monitor = HealthMonitor(client)
    monitor.set_endpoints([endpoint(4, await serve(worker.app()))])
    async with asyncio.timeout(10):
        status = await monitor.check_once(4)
    assert status.healthy
    assert (status.running, status.waiting, status.kv_usage) == (None, None, None)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_gauges_sum_engines_and_take_the_fullest_kv_cache(
    client: UpstreamClient, serve: Serve
) -> None:
    worker = FakeWorker()
    worker.metrics = (
        'vllm:num_requests_running{engine="0"} 2\n'
        'vllm:num_requests_running{engine="1"} 3\n'
        'vllm:num_requests_waiting{engine="0"} 1\n'
        'vllm:gpu_cache_usage_perc{engine="0"} 0.2\n'  # vLLM < 0.10's name
        'vllm:gpu_cache_usage_perc{engine="1"} 0.7\n'
    )
    monitor = HealthMonitor(client)
    monitor.set_endpoints([endpoint(4, await serve(worker.app()))])
    async with asyncio.timeout(10):
        status = await monitor.check_once(4)
    assert (status.running, status.waiting, status.kv_usage) == (5, 1, 0.7)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_an_endpoint_turning_ready_is_probed_afresh_at_once(
    client: UpstreamClient, serve: Serve
) -> None:
    """Failures seen while the engine was starting don't outlive the worker's "ready"."""
    worker = FakeWorker()
    worker.health_status = 503  # the engine is still loading
    base = await serve(worker.app())
    # /health only on a watch's first tick: without the fresh probe, recovery would take ~50 s.
    monitor = HealthMonitor(client, HealthConfig(interval_s=0.05, health_every=1000))
    starting = msgspec.structs.replace(endpoint(4, base), state="starting")
    monitor.set_endpoints([starting])
    await monitor.start()
    try:
        async with asyncio.timeout(10):
            await wait_until(monitor, 4, lambda s: s.health_failures >= 1)
            assert not monitor.status(4).healthy  # type: ignore[union-attr]
            worker.health_status = 200
            monitor.set_endpoints([endpoint(4, base)])  # the snapshot now says "ready"
            assert monitor.status(4) == EndpointStatus(endpoint_id=4, base_url=base)
            await wait_until(monitor, 4, lambda s: s.healthy, within=2.0)
            monitor.set_endpoints([endpoint(4, base)])  # still ready: nothing starts over
            assert monitor.status(4).healthy  # type: ignore[union-attr]
    finally:
        await monitor.stop()


@pytest.mark.integration
@pytest.mark.asyncio
async def test_set_endpoints_follows_the_snapshot(
    client: UpstreamClient, monitor: HealthMonitor, serve: Serve
) -> None:
    base = await serve(FakeWorker().app())
    gone = msgspec.structs.replace(endpoint(2, base), state="gone")
    monitor.set_endpoints([endpoint(1, base), gone])
    assert set(monitor.statuses()) == {1}
    await monitor.start()
    async with asyncio.timeout(10):
        await wait_until(monitor, 1, lambda s: s.healthy)
        monitor.set_endpoints([endpoint(1, base), endpoint(5, base)])
        await wait_until(monitor, 5, lambda s: s.healthy)
        monitor.set_endpoints([endpoint(5, base)])
        assert monitor.status(1) is None
        # a moved endpoint (new URL) starts over as unknown
        monitor.set_endpoints([endpoint(5, base + "/")])
        assert monitor.status(5) == EndpointStatus(endpoint_id=5, base_url=base + "/")
        await wait_until(monitor, 5, lambda s: s.healthy)
    await monitor.stop()
    assert monitor.status(5) is not None  # stop keeps the last statuses


# 50 ms scrapes, /health every 4th: an idle endpoint is scraped every 200 ms, with /health.
ADAPTIVE = HealthConfig(interval_s=0.05, health_every=4, unhealthy_after=3, probe_timeout_s=2.0)


@contextlib.asynccontextmanager
async def watching(
    client: UpstreamClient, serve: Serve, worker: FakeWorker, endpoint_id: int,
    config: HealthConfig = ADAPTIVE,
) -> AsyncIterator[HealthMonitor]:  # fmt: skip
    """A started monitor of ``worker`` served as endpoint ``endpoint_id``; stopped after."""
    monitor = HealthMonitor(client, config)
    monitor.set_endpoints([endpoint(endpoint_id, await serve(worker.app()))])
    await monitor.start()
    try:
        yield monitor
    finally:
        await monitor.stop()


@pytest.mark.integration
@pytest.mark.asyncio
async def test_an_idle_endpoint_is_scraped_only_with_its_health_checks(
    client: UpstreamClient, serve: Serve
) -> None:
    worker = FakeWorker()  # nothing running, nothing waiting
    async with watching(client, serve, worker, 6) as monitor:
        await async_eventually(lambda: worker.checks >= 5, timeout=10)
        # busy, it would be scraped 4x per /health check (see the next test)
        assert worker.scrapes <= worker.checks + 1
        status = monitor.status(6)
        assert status is not None
        assert status.healthy


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_busy_endpoint_is_scraped_at_interval_s(
    client: UpstreamClient, serve: Serve
) -> None:
    worker = FakeWorker()
    worker.metrics = "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"
    async with watching(client, serve, worker, 7):
        await async_eventually(lambda: worker.checks >= 3, timeout=10)
        # idle, each scrape would come with its /health check (scrapes <= checks + 1)
        assert worker.scrapes >= worker.checks + 3


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_first_byte_wakes_an_idle_endpoints_scrape(
    client: UpstreamClient, serve: Serve
) -> None:
    worker = FakeWorker()
    config = replace(ADAPTIVE, idle_interval_s=60.0)
    async with watching(client, serve, worker, 8, config) as monitor:
        await async_eventually(lambda: worker.scrapes >= 1 and monitor._wakers, timeout=10)
        scraped = worker.scrapes
        monitor.note_success(8)  # a real request's first byte: scraped now, not in 60 s
        await async_eventually(lambda: worker.scrapes >= scraped + 2, timeout=10)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_a_failing_scrape_of_an_idle_endpoint_is_counted_at_interval_s(
    client: UpstreamClient, serve: Serve
) -> None:
    worker = FakeWorker()
    config = replace(ADAPTIVE, idle_interval_s=0.3)
    async with watching(client, serve, worker, 9, config) as monitor:
        await async_eventually(lambda: worker.checks >= 2, timeout=10)
        worker.metrics_status = 500
        checks = worker.checks
        await wait_until(monitor, 9, lambda s: not s.healthy, within=10)
        # the run of 3 failures came at interval_s: at most one /health check per 4 scrapes
        assert worker.checks - checks <= 2


@pytest.mark.unit
def test_idle_period_defaults_to_the_health_period_and_never_under_interval_s() -> None:
    assert HealthConfig().idle_period_s == 1.0
    assert HealthConfig(interval_s=0.5, idle_interval_s=0.1).idle_period_s == 0.5
    with pytest.raises(ValueError, match="idle_interval_s"):
        HealthConfig(idle_interval_s=0)


@pytest.mark.unit
def test_config_refuses_nonsense() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        HealthConfig(interval_s=0)
    with pytest.raises(ValueError, match="unhealthy_after"):
        HealthConfig(unhealthy_after=0)
