"""UpstreamClient against the real simulator (and two tiny misbehaving servers)."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio
from aiohttp import web
from fixtures.wait import async_eventually

from runtime.upstream import (
    ClientConfig,
    StreamBroken,
    TimeoutPolicy,
    UpstreamClient,
    UpstreamHTTPError,
)
from tests.runtime.upstream.conftest import SIM_MODEL, Simulator, drain, endpoint, make_client

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def chat(max_tokens: int, *, stream: bool = True) -> bytes:
    return json.dumps(
        {
            "model": SIM_MODEL,
            "messages": [{"role": "user", "content": "hello there"}],
            "max_tokens": max_tokens,
            "stream": stream,
        }
    ).encode()


def deadline_in(seconds: float) -> float:
    return asyncio.get_running_loop().time() + seconds


@pytest_asyncio.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    c = make_client(ClientConfig(timeouts=TimeoutPolicy(first_byte_cap=10.0)))
    yield c
    await c.close()


async def gauge(client: UpstreamClient, sim: Simulator, name: str) -> float:
    status, body = await client.probe(sim.base_url, "/metrics", timeout_s=2.0)
    assert status == 200
    for line in body.decode().splitlines():
        if line.startswith((name + "{", name + " ")):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


async def wait_for_gauge(
    client: UpstreamClient, sim: Simulator, name: str, want: float, *, within: float
) -> float:
    """Poll a gauge (bounded in time and count) until it reads ``want``; the elapsed time."""
    loop = asyncio.get_running_loop()
    start = loop.time()

    async def reached() -> bool:
        return await gauge(client, sim, name) == want

    await async_eventually(reached, timeout=within, what=f"{name} == {want}")
    return loop.time() - start


async def test_stream_yields_events_then_stops_at_done(
    client: UpstreamClient, simulator: Simulator
) -> None:
    ep = endpoint(1, simulator.base_url)
    async with asyncio.timeout(20):
        resp = await client.open_stream(
            ep, "/v1/chat/completions", chat(8), deadline=deadline_in(15)
        )
        async with resp:
            assert resp.is_stream
            assert resp.status == 200
            events = [json.loads(e) async for e in resp.events()]
            assert resp.done
    assert events[0]["choices"][0]["delta"].get("role") == "assistant"
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events)
    assert text
    assert events[-1]["choices"][0]["finish_reason"] == "length"


async def test_the_simulators_chunks_come_with_their_bytes_for_the_relay(
    client: UpstreamClient, simulator: Simulator
) -> None:
    """Over a real socket, the engine's chunks reach batches() with their own bytes (what the
    relay forwards as it came), exactly the framing of their payloads."""
    ep = endpoint(1, simulator.base_url)
    async with asyncio.timeout(20):
        resp = await client.open_stream(
            ep, "/v1/chat/completions", chat(16), deadline=deadline_in(15)
        )
        async with resp:
            batches = [batch async for batch in resp.batches()]
            assert resp.done
    # the opening events were decoded before the response was handed out, and a chunk that
    # ends with [DONE] comes without its bytes: the ones between are the engine's own (a read
    # the socket split would not be, hence "most", though loopback never split one here)
    middle = batches[1:-1]
    forwarded = [raw for raw, _ in middle if raw is not None]
    assert len(forwarded) >= max(1, len(middle) // 2)
    for raw, payloads in batches:
        if raw is not None:
            assert raw == b"".join(b"data: " + p + b"\n\n" for p in payloads)
    assert sum(len(payloads) for _, payloads in batches) >= 16  # role, 16 tokens, none lost


async def test_unary_body_is_read_whole(client: UpstreamClient, simulator: Simulator) -> None:
    ep = endpoint(1, simulator.base_url)
    async with asyncio.timeout(20):
        resp = await client.open_stream(
            ep,
            "/v1/chat/completions",
            chat(4, stream=False),
            deadline=deadline_in(15),
            first_byte_cap=math.inf,
        )
    async with resp:
        assert not resp.is_stream
        body = json.loads(await resp.read_json())
    assert body["usage"]["completion_tokens"] == 4
    with pytest.raises(RuntimeError, match="not a stream"):
        [e async for e in resp.events()]


async def test_client_error_is_passed_back_with_its_body(
    client: UpstreamClient, simulator: Simulator
) -> None:
    ep = endpoint(1, simulator.base_url)
    body = json.dumps({"model": "no-such-model", "prompt": "x", "stream": True}).encode()
    with pytest.raises(UpstreamHTTPError) as info:
        await client.open_stream(ep, "/v1/completions", body, deadline=deadline_in(10))
    assert info.value.status == 404
    assert not info.value.retryable
    assert not info.value.endpoint_fault
    assert b"does not exist" in info.value.body
    assert info.value.endpoint_id == 1


async def test_closing_early_frees_the_engine_slot(
    client: UpstreamClient, simulator: Simulator
) -> None:
    ep = endpoint(1, simulator.base_url)
    running = "vllm:num_requests_running"
    async with asyncio.timeout(30):
        resp = await client.open_stream(
            ep, "/v1/chat/completions", chat(3000), deadline=deadline_in(60)
        )
        events = resp.events()
        for _ in range(3):
            await anext(events)
        assert await gauge(client, simulator, running) == 1
        await events.aclose()  # the consumer leaves (client disconnect)
        assert resp.closed
        elapsed = await wait_for_gauge(client, simulator, running, 0, within=2.0)
    assert elapsed < 2.0


async def test_cancelling_the_reader_task_frees_the_engine_slot(
    client: UpstreamClient, simulator: Simulator
) -> None:
    ep = endpoint(1, simulator.base_url)
    started = asyncio.Event()

    async def relay() -> None:
        async with await client.open_stream(
            ep, "/v1/chat/completions", chat(3000), deadline=deadline_in(60)
        ) as resp:
            async for _ in resp.events():
                started.set()

    async with asyncio.timeout(30):
        task = asyncio.create_task(relay())
        await started.wait()
        assert await gauge(client, simulator, "vllm:num_requests_running") == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await wait_for_gauge(client, simulator, "vllm:num_requests_running", 0, within=2.0)


async def test_upstream_dying_mid_stream_raises_stream_broken(
    client: UpstreamClient, failing_simulator: Simulator
) -> None:
    ep = endpoint(5, failing_simulator.base_url)
    broken: list[StreamBroken] = []
    loop = asyncio.get_running_loop()
    start = loop.time()
    async with asyncio.timeout(10):
        resp = await client.open_stream(
            ep, "/v1/chat/completions", chat(50), deadline=deadline_in(60)
        )
        resp.set_broken_listener(broken.append)
        got: list[bytes] = []
        with pytest.raises(StreamBroken) as info:
            await drain(resp, got)
    assert loop.time() - start < 5
    assert len(got) >= 1  # what was generated before the failure came through
    assert info.value.endpoint_fault
    assert info.value.reason in {"disconnected", "truncated"}
    assert info.value.endpoint_id == 5
    assert broken == [info.value]
    assert resp.closed


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@pytest_asyncio.fixture
async def serve() -> AsyncIterator[Callable[[Handler], Awaitable[str]]]:
    """Serve a one-route aiohttp app on a free port in this loop; returns its base URL."""
    runners: list[web.AppRunner] = []

    async def start(handler: Handler) -> str:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", handler)
        runner = web.AppRunner(app, handler_cancellation=True)
        await runner.setup()
        runners.append(runner)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        await runner.cleanup()


async def _one_event_then(
    request: web.Request, then: Callable[[], Awaitable[None]]
) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b'data: {"n": 1}\n\n')
    await then()
    return resp


async def test_stalled_stream_breaks_after_the_idle_cap(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    async def stall(request: web.Request) -> web.StreamResponse:
        return await _one_event_then(request, lambda: asyncio.sleep(30))

    base = await serve(stall)
    client = make_client(ClientConfig(timeouts=TimeoutPolicy(idle_cap=0.3)))
    try:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(10):
            resp = await client.open_stream(
                endpoint(1, base), "/v1/chat/completions", b"{}", deadline=deadline_in(20)
            )
            start = loop.time()
            events = resp.events()
            assert await anext(events) == b'{"n": 1}'
            with pytest.raises(StreamBroken) as info:
                await anext(events)
        assert 0.2 < loop.time() - start < 2.0
        assert info.value.reason == "stalled"
        assert info.value.endpoint_fault
    finally:
        await client.close()


async def test_the_idle_cap_counts_from_the_last_event_not_the_first(
    serve: Callable[[Handler], Awaitable[str]],
) -> None:
    """Events 0.15 s apart under a 0.4 s idle cap for longer than the cap: the read timer
    (armed once, re-armed when it fires early) must not break the stream on the first
    wait's due time; it breaks "stalled" about the cap after the last event."""

    async def trickle(request: web.Request) -> web.StreamResponse:
        async def more() -> None:
            for n in range(2, 8):
                await asyncio.sleep(0.15)
                await resp.write(b'data: {"n": %d}\n\n' % n)
            await asyncio.sleep(30)

        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"n": 1}\n\n')
        await more()
        return resp

    base = await serve(trickle)
    client = make_client(ClientConfig(timeouts=TimeoutPolicy(idle_cap=0.4)))
    try:
        loop = asyncio.get_running_loop()
        got: list[bytes] = []
        last = loop.time()

        async def read_all() -> None:
            nonlocal last
            async for payload in resp.events():
                got.append(payload)
                last = loop.time()

        async with asyncio.timeout(10):
            resp = await client.open_stream(
                endpoint(1, base), "/v1/chat/completions", b"{}", deadline=deadline_in(20)
            )
            with pytest.raises(StreamBroken) as info:
                await read_all()
        assert got == [b'{"n": %d}' % n for n in range(1, 8)]
        assert 0.3 < loop.time() - last < 2.0
        assert info.value.reason == "stalled"
    finally:
        await client.close()


async def test_deadline_mid_stream_breaks_without_blaming_the_endpoint(
    serve: Callable[[Handler], Awaitable[str]], client: UpstreamClient
) -> None:
    async def stall(request: web.Request) -> web.StreamResponse:
        return await _one_event_then(request, lambda: asyncio.sleep(30))

    base = await serve(stall)
    loop = asyncio.get_running_loop()
    deadline = deadline_in(0.5)
    async with asyncio.timeout(10):
        resp = await client.open_stream(
            endpoint(1, base), "/v1/chat/completions", b"{}", deadline=deadline
        )
        with pytest.raises(StreamBroken) as info:
            await drain(resp, [])
    assert deadline <= loop.time() < deadline + 0.5
    assert info.value.reason == "deadline"
    assert not info.value.endpoint_fault


async def test_stream_ending_without_done_is_truncated(
    serve: Callable[[Handler], Awaitable[str]], client: UpstreamClient
) -> None:
    async def nothing() -> None:
        return None

    async def short(request: web.Request) -> web.StreamResponse:
        return await _one_event_then(request, nothing)  # ends the body cleanly, no [DONE]

    base = await serve(short)
    async with asyncio.timeout(10):
        resp = await client.open_stream(
            endpoint(1, base), "/v1/chat/completions", b"{}", deadline=deadline_in(5)
        )
        got: list[bytes] = []
        with pytest.raises(StreamBroken) as info:
            await drain(resp, got)
    assert got == [b'{"n": 1}']
    assert info.value.reason == "truncated"


@pytest.mark.parametrize(
    "event",
    [
        # vLLM 0.32's create_streaming_error_response (json.dumps spacing), e.g. engine core dead
        b'{"error": {"message": "EngineCore encountered an issue.", "type": "InternalServerError",'
        b' "param": null, "code": 500}}',
        b'{"object":"error","message":"engine dead","type":"InternalServerError","code":500}',
    ],
)
async def test_an_error_event_from_the_engine_breaks_the_stream(
    serve: Callable[[Handler], Awaitable[str]], client: UpstreamClient, event: bytes
) -> None:
    async def error_then_done(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        await resp.write(b'data: {"n": 1}\n\n')
        await resp.write(b"data: " + event + b"\n\ndata: [DONE]\n\n")
        return resp

    base = await serve(error_then_done)
    async with asyncio.timeout(10):
        resp = await client.open_stream(
            endpoint(4, base), "/v1/chat/completions", b"{}", deadline=deadline_in(5)
        )
        broken: list[StreamBroken] = []
        resp.set_broken_listener(broken.append)
        got: list[bytes] = []
        with pytest.raises(StreamBroken) as info:
            await drain(resp, got)
    assert got == [b'{"n": 1}']  # the engine's error event itself is not relayed
    assert info.value.reason == "engine_error"
    assert info.value.endpoint_fault
    assert broken == [info.value]
