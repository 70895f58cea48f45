"""Passive health: probe timeouts are excused while real traffic to the endpoint succeeds.

The worker is an in-process aiohttp app whose probes answer, hang (the probe times out) or
fail as the test says; the monitor's clock is the test's, so the window is driven, not waited.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web
from fixtures.wait import async_eventually

from runtime.gateway.config import RouterConfig
from runtime.gateway.state import build_state
from runtime.snapshot import EndpointSnap
from runtime.upstream import (
    BreakerBook,
    EndpointStatus,
    HealthConfig,
    HealthMonitor,
    UpstreamClient,
    UpstreamHTTPError,
    UpstreamResponse,
    open_with_retry,
)
from tests.runtime.upstream.conftest import endpoint

pytestmark = pytest.mark.integration

LIMIT = 3
WINDOW = 5.0
CONFIG = HealthConfig(unhealthy_after=LIMIT, probe_timeout_s=0.25, passive_window_s=WINDOW)
CHAT = "/v1/chat/completions"
ID = 7


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Worker:
    """Probes answer 200 (``probe = "ok"``), hang until the test ends (``"hang"``) or answer
    ``probe_status`` (``"fail"``); the chat route streams a short answer or ``chat_status``."""

    def __init__(self) -> None:
        self.probe = "ok"
        self.probe_status = 503
        self.chat_status = 200
        self.released = asyncio.Event()
        self.runner: web.AppRunner | None = None

    async def _probe(self, request: web.Request) -> web.Response:
        if self.probe == "hang":
            await self.released.wait()
        if self.probe == "fail":
            return web.Response(status=self.probe_status)
        return web.Response(text="vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n")

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        if self.chat_status != 200:
            return web.json_response({"error": {"message": "no"}}, status=self.chat_status)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n')
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def start(self) -> str:
        app = web.Application()
        app.router.add_get("/health", self._probe)
        app.router.add_get("/metrics", self._probe)
        app.router.add_post(CHAT, self._chat)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"

    async def stop(self) -> None:
        """The process is gone: the port refuses connections from now on."""
        self.released.set()
        if self.runner is not None:
            runner, self.runner = self.runner, None
            await runner.cleanup()


@pytest_asyncio.fixture
async def worker() -> AsyncIterator[Worker]:
    w = Worker()
    yield w
    await w.stop()


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest_asyncio.fixture
async def monitor(client: UpstreamClient, worker: Worker, clock: Clock) -> HealthMonitor:
    """A monitor watching the worker as endpoint ``ID``, after a clean probe: both probes
    answered and no failure counted. A first probe that missed the 0.25 s timeout on a loaded
    machine is still "healthy" but counts one failure, and a test counting to
    ``unhealthy_after`` would see the eject one probe early; so probe until one is clean."""
    watching = HealthMonitor(client, CONFIG, clock=clock)
    watching.set_endpoints([endpoint(ID, await worker.start())])

    async def clean() -> bool:
        status = await watching.check_once(ID)
        return status.healthy and _clean(status)

    await async_eventually(clean, timeout=20, interval=0.05, what="a clean first probe")
    return watching


def _clean(status: EndpointStatus) -> bool:
    return (
        status.consecutive_failures == status.health_failures == 0
        and status.last_scrape is not None
        and status.last_health is not None
    )


async def probe_times(monitor: HealthMonitor, n: int) -> list[EndpointStatus]:
    return [await monitor.check_once(ID) for _ in range(n)]


@pytest.mark.asyncio
async def test_probe_timeouts_with_recent_traffic_keep_the_endpoint_healthy(
    monitor: HealthMonitor, worker: Worker, clock: Clock
) -> None:
    worker.probe = "hang"
    async with asyncio.timeout(10):
        monitor.note_success(ID)
        clock.now += 1.0
        statuses = await probe_times(monitor, LIMIT + 1)
    assert all(s.healthy for s in statuses)
    last = statuses[-1]
    assert (last.consecutive_failures, last.health_failures) == (LIMIT + 1, LIMIT + 1)
    assert (last.metrics_timeouts, last.health_timeouts) == (LIMIT + 1, LIMIT + 1)
    assert last.passive  # healthy only thanks to the traffic, and says so
    assert last.last_success == clock.now - 1.0 == monitor.last_success(ID)
    assert not statuses[0].passive  # one failure is tolerated anyway
    assert last.last_error is not None
    assert "/health" in last.last_error or "/metrics" in last.last_error
    worker.probe = "ok"
    async with asyncio.timeout(10):
        answered = await monitor.check_once(ID)
    assert answered.healthy
    assert not answered.passive
    assert (answered.metrics_timeouts, answered.health_timeouts) == (0, 0)


@pytest.mark.asyncio
async def test_probe_timeouts_without_traffic_eject_after_unhealthy_after(
    monitor: HealthMonitor, worker: Worker
) -> None:
    worker.probe = "hang"
    async with asyncio.timeout(10):
        statuses = await probe_times(monitor, LIMIT)
    assert [s.healthy for s in statuses] == [True] * (LIMIT - 1) + [False]
    assert statuses[-1].last_success is None
    assert not statuses[-1].passive


@pytest.mark.asyncio
async def test_the_window_passing_without_traffic_ejects_and_traffic_brings_it_back(
    monitor: HealthMonitor, worker: Worker, clock: Clock
) -> None:
    worker.probe = "hang"
    monitor.note_success(ID)
    async with asyncio.timeout(10):
        assert all(s.healthy for s in await probe_times(monitor, LIMIT))
        clock.now += WINDOW  # still within: the bound is inclusive
        assert (await monitor.check_once(ID)).healthy
        clock.now += 0.01  # the engine hangs: no request has been answered since
        ejected = await monitor.check_once(ID)
        assert not ejected.healthy
        assert not ejected.passive
        # A request answered again (the probes still time out): back at the next probe.
        monitor.note_success(ID)
        back = await monitor.check_once(ID)
    assert back.healthy
    assert back.passive


@pytest.mark.asyncio
@pytest.mark.parametrize("status", [503, 500])
async def test_failing_probe_answers_eject_despite_recent_traffic(
    monitor: HealthMonitor, worker: Worker, clock: Clock, status: int
) -> None:
    worker.probe = "fail"
    worker.probe_status = status
    async with asyncio.timeout(10):
        monitor.note_success(ID)
        statuses = await probe_times(monitor, LIMIT)
    assert [s.healthy for s in statuses] == [True] * (LIMIT - 1) + [False]
    assert statuses[-1].last_success == clock.now  # the evidence was there, and not enough
    assert statuses[-1].last_error in (f"/health: HTTP {status}", f"/metrics: HTTP {status}")


@pytest.mark.asyncio
async def test_a_refused_connection_ejects_despite_recent_traffic(
    monitor: HealthMonitor, worker: Worker
) -> None:
    """A refused connection means the process is gone: its traffic is no evidence."""
    await worker.stop()
    async with asyncio.timeout(10):
        monitor.note_success(ID)
        statuses = await probe_times(monitor, LIMIT)
    last = statuses[-1]
    assert not last.healthy
    assert last.consecutive_failures == last.health_failures == LIMIT
    assert last.metrics_timeouts == last.health_timeouts == 0


@pytest.mark.asyncio
async def test_a_new_endpoint_whose_first_probes_time_out_stays_usable_for_a_full_run(
    client: UpstreamClient, worker: Worker, clock: Clock
) -> None:
    """Not yet confirmed is not refused: timeouts eject it after ``unhealthy_after``, as they
    would a confirmed one (CI: a router's loop stalled at start; every request got 503)."""
    monitor = HealthMonitor(client, CONFIG, clock=clock)
    monitor.set_endpoints([endpoint(ID, await worker.start())])
    worker.probe = "hang"
    async with asyncio.timeout(10):
        statuses = await probe_times(monitor, LIMIT)
    assert [s.healthy for s in statuses] == [True] * (LIMIT - 1) + [False]
    assert (statuses[0].last_scrape, statuses[0].last_health) == (None, None)
    worker.probe = "ok"
    async with asyncio.timeout(10):
        assert (await monitor.check_once(ID)).healthy


@pytest.mark.asyncio
@pytest.mark.parametrize("gone", [False, True], ids=["failing-answer", "refused"])
async def test_a_new_endpoint_is_refused_at_its_first_definite_failure(
    client: UpstreamClient, worker: Worker, clock: Clock, gone: bool
) -> None:
    monitor = HealthMonitor(client, CONFIG, clock=clock)
    monitor.set_endpoints([endpoint(ID, await worker.start())])
    if gone:
        await worker.stop()
    else:
        worker.probe = "fail"
    async with asyncio.timeout(10):
        first = await monitor.check_once(ID)
    assert not first.healthy
    assert first.health_failures == 1


@pytest.mark.asyncio
async def test_one_definite_failure_in_a_run_of_timeouts_is_not_excused(
    monitor: HealthMonitor, worker: Worker
) -> None:
    monitor.note_success(ID)
    async with asyncio.timeout(10):
        worker.probe = "hang"
        await probe_times(monitor, LIMIT - 1)
        worker.probe = "fail"
        failed = await monitor.check_once(ID)
    assert failed.health_failures == LIMIT
    assert failed.health_timeouts == LIMIT - 1
    assert not failed.healthy


@pytest.mark.asyncio
async def test_metrics_timeouts_alone_are_excused_too(
    monitor: HealthMonitor, worker: Worker
) -> None:
    worker.probe = "hang"
    monitor.note_success(ID)
    async with asyncio.timeout(10):
        statuses = [await monitor.check_once(ID, health=False) for _ in range(LIMIT)]
    assert statuses[-1].consecutive_failures == LIMIT
    assert statuses[-1].health_failures == 0
    assert statuses[-1].healthy
    assert statuses[-1].passive
    assert statuses[-1].running == 1  # the last good reading is kept


@pytest.mark.asyncio
async def test_a_zero_window_turns_passive_evidence_off(
    client: UpstreamClient, worker: Worker, clock: Clock
) -> None:
    monitor = HealthMonitor(
        client, HealthConfig(unhealthy_after=1, passive_window_s=0), clock=clock
    )
    monitor.set_endpoints([endpoint(ID, await worker.start())])
    async with asyncio.timeout(10):
        assert (await monitor.check_once(ID)).healthy
        worker.probe = "fail"
        monitor.note_success(ID)
        assert not (await monitor.check_once(ID)).healthy


@pytest.mark.unit
def test_successes_of_unwatched_or_forgotten_endpoints_are_dropped(
    client: UpstreamClient, clock: Clock
) -> None:
    monitor = HealthMonitor(client, CONFIG, clock=clock)
    monitor.note_success(ID)  # not watched
    assert monitor.last_success(ID) is None
    monitor.set_endpoints([endpoint(ID, "http://127.0.0.1:9")])
    monitor.note_success(ID)
    assert monitor.last_success(ID) == clock.now
    monitor.set_endpoints([])  # gone from the snapshot: its evidence goes too
    monitor.set_endpoints([endpoint(ID, "http://127.0.0.1:9")])
    assert monitor.last_success(ID) is None


@pytest.mark.unit
def test_config_refuses_a_negative_window() -> None:
    with pytest.raises(ValueError, match="passive_window_s"):
        HealthConfig(passive_window_s=-1)


@pytest.mark.asyncio
async def test_a_request_opened_through_dispatch_is_noted_as_a_success(
    client: UpstreamClient, monitor: HealthMonitor, worker: Worker, clock: Clock
) -> None:
    """The wiring the gateway uses: the breaker book reports its successes to the monitor."""
    breakers = BreakerBook(on_success=monitor.note_success)
    ep = endpoint(ID, worker_url(monitor))
    loop = asyncio.get_running_loop()
    body = b'{"model":"m","messages":[],"stream":true}'

    def pick(excluded: frozenset[int]) -> EndpointSnap | None:
        return None if ID in excluded else ep

    async def send(**options: int) -> tuple[EndpointSnap, UpstreamResponse]:
        return await open_with_retry(
            pick, client, breakers, CHAT, body, deadline=loop.time() + 5, rng=random.Random(1),
            **options,
        )  # fmt: skip

    worker.chat_status = 503  # a failed request is no evidence
    async with asyncio.timeout(10):
        with pytest.raises(UpstreamHTTPError):
            await send(max_attempts=1)
    assert monitor.last_success(ID) is None
    worker.chat_status = 200
    clock.now += 1.0
    async with asyncio.timeout(10):
        chosen, resp = await send()
        await resp.aclose()
    assert chosen.id == ID
    assert monitor.last_success(ID) == clock.now
    worker.probe = "hang"
    async with asyncio.timeout(10):
        statuses = await probe_times(monitor, LIMIT)
    assert statuses[-1].healthy
    assert statuses[-1].passive
    assert statuses[-1].last_success == clock.now


def worker_url(monitor: HealthMonitor) -> str:
    status = monitor.status(ID)
    assert status is not None
    return status.base_url


@pytest.mark.unit
@pytest.mark.asyncio
async def test_the_router_state_reports_breaker_successes_to_its_monitor(
    tmp_path: Path,
) -> None:
    """build_state's wiring, without starting anything (no Redis, no sockets)."""
    state = build_state(RouterConfig(snapshot_cache_path=tmp_path / "snapshot.json"))
    try:
        state.health.set_endpoints([endpoint(ID, "http://127.0.0.1:9")])
        state.breakers.get(ID).record_failure()
        assert state.health.last_success(ID) is None
        loop = asyncio.get_running_loop()
        before = loop.time()
        state.breakers.get(ID).record_success()
        noted = state.health.last_success(ID)
        assert noted is not None
        assert before <= noted <= loop.time()  # the monitor's default clock: the loop's
    finally:
        await state.client.close()
