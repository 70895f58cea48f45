"""open_with_retry: retries before the first byte, breakers, backoff and the deadline."""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from fixtures.wait import async_eventually

from runtime.snapshot import EndpointSnap
from runtime.upstream import (
    BreakerBook,
    BreakerConfig,
    BreakerState,
    ClientConfig,
    ConnectFailed,
    DeadlineExceeded,
    NoEndpointAvailable,
    StreamBroken,
    TimeoutPolicy,
    UpstreamClient,
    UpstreamHTTPError,
    UpstreamResponse,
    backoff_delay,
    open_with_retry,
)
from tests.runtime.upstream.conftest import SIM_MODEL, Simulator, drain, endpoint, make_client

pytestmark = pytest.mark.integration

PATH = "/v1/chat/completions"


def body(*, model: str = SIM_MODEL, max_tokens: int = 4) -> bytes:
    return json.dumps(
        {
            "model": model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens,
            "stream": True,
        }
    ).encode()


class InOrder:
    """A picker: the first endpoint of the list not excluded; records what it was asked."""

    def __init__(self, endpoints: Sequence[EndpointSnap]) -> None:
        self.endpoints = list(endpoints)
        self.calls: list[frozenset[int]] = []

    def __call__(self, excluded: frozenset[int]) -> EndpointSnap | None:
        self.calls.append(excluded)
        return next((e for e in self.endpoints if e.id not in excluded), None)


@pytest.mark.unit
def test_backoff_is_full_jitter_under_an_exponential_cap() -> None:
    rng = random.Random(7)
    for retry in range(1, 8):
        ceiling = min(1.0, 0.025 * 2 ** (retry - 1))
        delays = [backoff_delay(retry, base=0.025, cap=1.0, rng=rng) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays)
        assert max(delays) > ceiling * 0.8  # the whole range is used
        assert min(delays) < ceiling * 0.2


@pytest_asyncio.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    c = make_client(ClientConfig(timeouts=TimeoutPolicy(first_byte_cap=10.0)))
    yield c
    await c.close()


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Callable[[web.Application], Awaitable[str]]]:
    """Serve an aiohttp app on a free port in this loop; returns its base URL."""
    runners: list[web.AppRunner] = []

    async def start(app: web.Application) -> str:
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    yield start
    for runner in runners:
        await runner.cleanup()


def app_answering(status: int) -> web.Application:
    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"error": {"message": "nope"}}, status=status)

    app = web.Application()
    app.router.add_post(PATH, handler)
    return app


@pytest_asyncio.fixture
async def blackhole() -> AsyncIterator[str]:
    """A server that accepts connections and never answers (a hung worker)."""
    writers: list[asyncio.StreamWriter] = []

    async def swallow(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writers.append(writer)
        await reader.read(1 << 20)

    server = await asyncio.start_server(swallow, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    yield f"http://127.0.0.1:{port}"
    for writer in writers:
        writer.close()
    server.close()
    await server.wait_closed()


def now() -> float:
    return asyncio.get_running_loop().time()


async def dispatch(
    pick: Callable[[frozenset[int]], EndpointSnap | None],
    client: UpstreamClient,
    breakers: BreakerBook,
    *,
    payload: bytes | None = None,
    deadline: float | None = None,
    rng: random.Random | None = None,
    **options: Any,
) -> tuple[EndpointSnap, UpstreamResponse]:
    """``open_with_retry`` on ``PATH``: ``body()``, a 10 s deadline and ``Random(1)`` unless
    told otherwise."""
    return await open_with_retry(
        pick, client, breakers, PATH, body() if payload is None else payload,
        deadline=now() + 10 if deadline is None else deadline,
        rng=random.Random(1) if rng is None else rng, **options,
    )  # fmt: skip


@pytest.mark.integration
@pytest.mark.asyncio
async def test_refused_connection_is_retried_on_the_next_endpoint(
    client: UpstreamClient, simulator: Simulator, closed_port: int
) -> None:
    dead = endpoint(1, f"http://127.0.0.1:{closed_port}")
    live = endpoint(2, simulator.base_url)
    pick = InOrder([dead, live])
    breakers = BreakerBook(BreakerConfig(failure_threshold=1, cooldown_s=60))
    async with asyncio.timeout(20):
        chosen, resp = await dispatch(pick, client, breakers)
        async with resp:
            events = [e async for e in resp.events()]
    assert chosen.id == 2
    assert events
    assert pick.calls == [frozenset(), frozenset({1})]
    assert breakers.get(1).state is BreakerState.OPEN
    assert breakers.get(2).state is BreakerState.CLOSED

    # The open breaker keeps the next request off the dead endpoint without a connect.
    pick.calls.clear()
    async with asyncio.timeout(20):
        chosen, resp = await dispatch(pick, client, breakers)
        await resp.aclose()
    assert chosen.id == 2
    assert pick.calls == [frozenset(), frozenset({1})]
    assert breakers.get(1).consecutive_failures == 1


@pytest.mark.integration
@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("status", "held"),
    [(503, 1), (429, 0)],
    ids=["5xx-counts-against-the-endpoint", "429-is-not-held-against-the-endpoint"],
)
async def test_an_error_answer_is_retried_elsewhere(
    client: UpstreamClient,
    simulator: Simulator,
    serve: Callable[[web.Application], Awaitable[str]],
    status: int,
    held: int,
) -> None:
    failing = endpoint(1, await serve(app_answering(status)))
    pick = InOrder([failing, endpoint(2, simulator.base_url)])
    breakers = BreakerBook()
    async with asyncio.timeout(20):
        chosen, resp = await dispatch(pick, client, breakers)
        await resp.aclose()
    assert chosen.id == 2
    assert breakers.get(1).consecutive_failures == held


@pytest.mark.integration
@pytest.mark.asyncio
async def test_4xx_is_not_retried(client: UpstreamClient, simulator: Simulator) -> None:
    pick = InOrder([endpoint(1, simulator.base_url), endpoint(2, simulator.base_url)])
    breakers = BreakerBook()
    async with asyncio.timeout(20):
        with pytest.raises(UpstreamHTTPError) as info:
            await dispatch(pick, client, breakers, payload=body(model="unknown-model"))
    assert info.value.status == 404
    assert len(pick.calls) == 1
    assert breakers.get(1).consecutive_failures == 0


@pytest.mark.integration
@pytest.mark.asyncio
async def test_every_endpoint_failing_ends_with_no_endpoint_available(
    client: UpstreamClient, closed_port: int
) -> None:
    dead = [endpoint(i, f"http://127.0.0.1:{closed_port}") for i in (1, 2)]
    async with asyncio.timeout(20):
        with pytest.raises(NoEndpointAvailable) as info:
            await dispatch(InOrder(dead), client, BreakerBook(), max_attempts=5)
    assert isinstance(info.value.__cause__, ConnectFailed)


@pytest.mark.integration
@pytest.mark.asyncio
async def test_attempts_are_bounded_by_max_attempts(
    client: UpstreamClient, closed_port: int
) -> None:
    dead = [endpoint(i, f"http://127.0.0.1:{closed_port}") for i in range(1, 6)]
    pick = InOrder(dead)
    async with asyncio.timeout(20):
        with pytest.raises(ConnectFailed):
            await dispatch(pick, client, BreakerBook(), max_attempts=2)
    assert len(pick.calls) == 2


@pytest.mark.asyncio
@pytest.mark.unit
async def test_no_endpoint_at_all(client: UpstreamClient) -> None:
    with pytest.raises(NoEndpointAvailable):
        await dispatch(InOrder([]), client, BreakerBook(), deadline=now() + 1, rng=random.Random())


@pytest.mark.integration
@pytest.mark.asyncio
async def test_hung_endpoints_time_out_and_the_deadline_bounds_the_whole_request(
    client: UpstreamClient, blackhole: str
) -> None:
    hung = [endpoint(i, blackhole) for i in range(1, 20)]
    pick = InOrder(hung)
    breakers = BreakerBook()
    start = now()
    async with asyncio.timeout(10):
        with pytest.raises(DeadlineExceeded) as info:
            await dispatch(
                pick,
                client,
                breakers,
                deadline=start + 0.8,
                rng=random.Random(3),
                max_attempts=20,
                first_byte_cap=0.2,
            )
    elapsed = now() - start
    assert elapsed < 0.8 + 0.3  # the deadline, plus slack for a loaded test machine
    assert len(pick.calls) >= 3  # several endpoints were tried within the budget
    assert breakers.get(1).consecutive_failures == 1  # a TTFT timeout is the endpoint's fault
    assert not info.value.retryable


@pytest.mark.integration
@pytest.mark.asyncio
async def test_deadline_shorter_than_the_ttft_cap(client: UpstreamClient, blackhole: str) -> None:
    breakers = BreakerBook()
    start = now()
    async with asyncio.timeout(10):
        with pytest.raises(DeadlineExceeded):
            await dispatch(
                InOrder([endpoint(1, blackhole)]),
                client,
                breakers,
                deadline=start + 0.3,
                rng=random.Random(),
            )
    assert 0.29 <= now() - start < 0.8
    # the request ran out of time: no verdict on the endpoint
    assert breakers.get(1).consecutive_failures == 0


@pytest.mark.integration
@pytest.mark.asyncio
async def test_cancelled_half_open_probe_gives_the_probe_slot_back(
    client: UpstreamClient, blackhole: str
) -> None:
    breakers = BreakerBook(BreakerConfig(failure_threshold=1, cooldown_s=0.0))
    breakers.get(1).record_failure()  # open; cooldown 0: the next request is the probe
    task = asyncio.create_task(
        dispatch(InOrder([endpoint(1, blackhole)]), client, breakers, rng=random.Random())
    )
    async with asyncio.timeout(10):
        await async_eventually(lambda: not breakers.get(1).available(), what="the probe is out")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    assert breakers.get(1).state is BreakerState.HALF_OPEN
    assert breakers.get(1).available()


@pytest.mark.integration
@pytest.mark.asyncio
async def test_stream_broken_after_first_byte_is_reported_to_the_breaker(
    client: UpstreamClient, failing_simulator: Simulator
) -> None:
    breakers = BreakerBook()
    async with asyncio.timeout(20):
        chosen, resp = await dispatch(
            InOrder([endpoint(9, failing_simulator.base_url)]),
            client,
            breakers,
            payload=body(max_tokens=40),
            rng=random.Random(),
        )
        with pytest.raises(StreamBroken):
            await drain(resp, [])
    assert chosen.id == 9
    assert breakers.get(9).consecutive_failures == 1


@pytest_asyncio.fixture
async def hangup() -> AsyncIterator[str]:
    """A server that reads the request and closes the connection without a byte of answer."""

    async def close_at_once(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1024)
        writer.close()

    server = await asyncio.start_server(close_at_once, "127.0.0.1", 0)
    yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    server.close()
    await server.wait_closed()


def app_with_empty_stream() -> web.Application:
    async def handler(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b": only a comment, then the end\n\n")
        return resp

    app = web.Application()
    app.router.add_post(PATH, handler)
    return app


@pytest.mark.integration
@pytest.mark.asyncio
async def test_connection_dropped_before_any_answer_is_retried(
    client: UpstreamClient, simulator: Simulator, hangup: str
) -> None:
    breakers = BreakerBook()
    pick = InOrder([endpoint(1, hangup), endpoint(2, simulator.base_url)])
    async with asyncio.timeout(20):
        chosen, resp = await dispatch(pick, client, breakers)
        await resp.aclose()
    assert chosen.id == 2
    assert breakers.get(1).consecutive_failures == 1


@pytest.mark.integration
@pytest.mark.asyncio
async def test_stream_ending_before_its_first_event_is_retried(
    client: UpstreamClient,
    simulator: Simulator,
    serve: Callable[[web.Application], Awaitable[str]],
) -> None:
    breakers = BreakerBook()
    empty = endpoint(1, await serve(app_with_empty_stream()))
    pick = InOrder([empty, endpoint(2, simulator.base_url)])
    async with asyncio.timeout(20):
        chosen, resp = await dispatch(pick, client, breakers)
        await resp.aclose()
    assert chosen.id == 2
    assert breakers.get(1).consecutive_failures == 1
