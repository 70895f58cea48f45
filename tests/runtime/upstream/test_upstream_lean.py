"""What only the lean client has: its pool's connection cap and queue, a stream released at
``[DONE]`` before the chunked terminator came still going back to the pool, and request
headers checked for line breaks; the setting that picks it. The contract both clients share is
test_upstream_conformance.py's."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from aiohttp import web
from fixtures.wait import async_eventually

from runtime.gateway.config import UPSTREAM_CLIENTS, ConfigError, RouterConfig
from runtime.gateway.state import build_state
from runtime.upstream.choice import CLIENTS
from runtime.upstream.client import ClientConfig, UpstreamClient
from runtime.upstream.lean import LeanUpstreamClient
from tests.runtime.upstream.conftest import drain, endpoint

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


class Worker:
    """``/late-end``: two events and ``[DONE]``, the chunked terminator 50 ms later;
    ``/stall``: one event, then silence."""

    def __init__(self) -> None:
        self.ports: list[int] = []
        self.runner: web.AppRunner | None = None

    async def _stream(self, request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        self.ports.append(peer[1] if peer else -1)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"n":1}\n\n')
        if request.path == "/stall":
            await asyncio.sleep(60)
        await resp.write(b'data: {"n":2}\n\ndata: [DONE]\n\n')
        await asyncio.sleep(0.05)  # the terminator comes after the relay saw [DONE]
        return resp

    async def start(self) -> str:
        app = web.Application()
        app.router.add_post("/late-end", self._stream)
        app.router.add_post("/stall", self._stream)
        self.runner = web.AppRunner(app, handler_cancellation=True)
        await self.runner.setup()
        await web.TCPSite(self.runner, "127.0.0.1", 0).start()
        return f"http://127.0.0.1:{self.runner.addresses[0][1]}"


@pytest_asyncio.fixture
async def worker() -> AsyncIterator[Worker]:
    w = Worker()
    yield w
    if w.runner is not None:
        await w.runner.cleanup()


def _deadline() -> float:
    return asyncio.get_running_loop().time() + 10


async def test_a_stream_released_at_done_goes_back_once_its_terminator_comes(
    worker: Worker,
) -> None:
    client = LeanUpstreamClient()
    ep = endpoint(1, await worker.start())
    try:
        async with asyncio.timeout(10):
            for _ in range(2):
                events: list[bytes] = []
                await drain(
                    await client.open_stream(ep, "/late-end", b"{}", deadline=_deadline()), events
                )
                assert events == [b'{"n":1}', b'{"n":2}']
                await async_eventually(lambda: _idle(client, ep.base_url) == 1, timeout=5)
    finally:
        await client.close()
    assert len(set(worker.ports)) == 1


def _idle(client: LeanUpstreamClient, base_url: str) -> int:
    pool = client.pool(base_url)
    return -1 if pool is None else pool.idle_count


async def test_connections_per_endpoint_are_capped_and_acquirers_wait_their_turn(
    worker: Worker,
) -> None:
    client = LeanUpstreamClient(ClientConfig(limit_per_host=1))
    ep = endpoint(1, await worker.start())
    try:
        async with asyncio.timeout(10):
            first = await client.open_stream(ep, "/stall", b"{}", deadline=_deadline())
            second = asyncio.create_task(
                client.open_stream(ep, "/late-end", b"{}", deadline=_deadline())
            )
            pool = client.pool(ep.base_url)
            assert pool is not None
            await async_eventually(lambda: pool.waiting == 1, timeout=5, what="queued")
            assert pool.open_count == 1
            assert len(worker.ports) == 1
            await first.aclose()  # cut (never reused): the waiter opens a new connection
            await drain(await second, [])
    finally:
        await client.close()
    assert len(worker.ports) == 2
    assert worker.ports[0] != worker.ports[1]


async def test_a_header_with_a_line_break_is_refused() -> None:
    client = LeanUpstreamClient()
    try:
        with pytest.raises(ValueError, match="newline"):
            await client.open_stream(
                endpoint(1, "http://127.0.0.1:9"), "/x", b"{}", deadline=_deadline(),
                headers={"X-Request-Id": "a\r\nX-Evil: 1"},
            )  # fmt: skip
    finally:
        await client.close()


@pytest.mark.unit
async def test_the_setting_picks_the_client(tmp_path: Path) -> None:
    assert set(UPSTREAM_CLIENTS) == set(CLIENTS)
    with pytest.raises(ConfigError, match="SWITCHYARD_UPSTREAM_CLIENT must be one of"):
        RouterConfig.from_env({"SWITCHYARD_UPSTREAM_CLIENT": "curl"})
    cache = {"snapshot_cache_path": tmp_path / "snapshot.json"}
    for env, kind in (({}, LeanUpstreamClient), ({"SWITCHYARD_UPSTREAM_CLIENT": "AIOHTTP"}, None)):
        config = dataclasses.replace(RouterConfig.from_env(env), **cache)
        state = build_state(config)
        try:
            if kind is None:
                assert type(state.client) is UpstreamClient
            else:
                assert type(state.client) is kind
        finally:
            await state.client.close()
