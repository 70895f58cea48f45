"""DrainClient (one-off requests read to the end: shadow copies, capacity measurements) against
the real simulator and tiny misbehaving servers: what it reports, and how failures are classed."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer

from runtime.upstream.drain import DrainClient
from runtime.upstream.errors import ConnectFailed, DeadlineExceeded
from tests.runtime.upstream.conftest import SIM_MODEL, Simulator

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def completion(max_tokens: int, *, stream: bool) -> bytes:
    body = {"model": SIM_MODEL, "prompt": "hi", "max_tokens": max_tokens, "stream": stream,
            "ignore_eos": True}  # fmt: skip
    return json.dumps(body).encode()


@pytest_asyncio.fixture
async def drainer() -> AsyncIterator[DrainClient]:
    c = DrainClient(timeout_s=10.0)
    yield c
    await c.close()


async def test_a_stream_is_read_to_its_end_and_counted(
    drainer: DrainClient, simulator: Simulator
) -> None:
    answer = await drainer.post(f"{simulator.base_url}/v1/completions", completion(6, stream=True))
    assert answer.status == 200
    assert answer.broken is None
    assert answer.events == 6  # one per token; [DONE] is not an event
    assert answer.first_event_s is not None
    assert 0 < answer.headers_s <= answer.first_event_s <= answer.total_s


async def test_a_unary_answer_and_an_error_status_are_reported_not_raised(
    drainer: DrainClient, simulator: Simulator
) -> None:
    ok = await drainer.post(f"{simulator.base_url}/v1/completions", completion(3, stream=False))
    assert (ok.status, ok.events, ok.first_event_s, ok.broken) == (200, 0, None, None)
    missing = await drainer.post(f"{simulator.base_url}/v1/nowhere", b"{}")
    assert missing.status == 404
    assert missing.broken is None


async def test_a_stream_cut_after_the_headers_is_broken_with_what_arrived(
    drainer: DrainClient, failing_simulator: Simulator
) -> None:
    answer = await drainer.post(
        f"{failing_simulator.base_url}/v1/completions", completion(50, stream=True)
    )
    assert answer.status == 200
    assert answer.broken is not None
    assert answer.broken.reason == "disconnected"
    assert 1 <= answer.events <= 5  # the simulator cuts after 5 tokens


async def test_nothing_listening_is_connect_failed(drainer: DrainClient, closed_port: int) -> None:
    with pytest.raises(ConnectFailed):
        await drainer.post(f"http://127.0.0.1:{closed_port}/v1/completions", b"{}")


async def test_no_answer_in_time_is_deadline_exceeded_and_a_stall_mid_body_is_broken() -> None:
    release = asyncio.Event()

    async def silent(request: web.Request) -> web.StreamResponse:
        await release.wait()
        return web.Response(text="late")

    async def stalls(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"n": 1}\n\n')
        await release.wait()
        return resp

    app = web.Application()
    app.router.add_post("/silent", silent)
    app.router.add_post("/stalls", stalls)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    client = DrainClient(timeout_s=0.3)
    try:
        with pytest.raises(DeadlineExceeded):
            await client.post(f"http://127.0.0.1:{server.port}/silent", b"{}")
        answer = await client.post(f"http://127.0.0.1:{server.port}/stalls", b"{}")
        assert (answer.status, answer.events) == (200, 1)
        assert answer.broken is not None
        assert answer.broken.reason == "deadline"
    finally:
        release.set()
        await client.close()
        await server.close()


async def test_a_closed_client_refuses() -> None:
    client = DrainClient()
    await client.close()
    with pytest.raises(RuntimeError, match="closed"):
        await client.post("http://127.0.0.1:9/x", b"{}")
