"""Streams that wait in the pool queue: headers at once, ``: queued`` comments while they wait
(issue #33), through a real router in front of a one-slot simulator.

A long stream holds the only slot; the streams under test queue behind it for about
``HOLD_TOKENS`` x 20 ms. Their clients' read timeouts are shorter than that wait.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fixtures.wait import async_eventually
from gateway_fleet import (
    Fleet,
    Publisher,
    World,
    metric_value,
    start_router,
    start_simulator,
    wait_ready,
)

from bench.idle_proxy import IdleProxy

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

HOLD_TOKENS = 150  # 20 ms per token: the slot is held for about 3 s
CLASSES = {"beat": 200, "quiet": 0, "proxied": 1000}  # class -> heartbeat_ms


def start_fleet(var_dir: Path) -> Fleet:
    """One one-slot simulator behind a router; a class per heartbeat interval of CLASSES."""
    publisher = Publisher(f"switchyard:test:gw-beat:{uuid.uuid4().hex[:10]}")
    world = World()
    for name, beat_ms in CLASSES.items():
        world.add_class(name, band=0, heartbeat_ms=beat_ms)
    world.add_tenant("acme", classes=tuple(CLASSES), default_class="beat")
    world.add_key("good", "acme")
    world.add_model("beat", 1)
    sim = start_simulator("beat", "--max-num-seqs", "1", "--decode-a-ms", "20")
    world.add_endpoint(1, 1, sim.base_url, pool="beat", capacity=1)
    version = publisher.publish(world.snapshot())
    try:
        router = start_router(publisher.prefix, var_dir)
    except BaseException:
        sim.stop()
        publisher.cleanup()
        raise
    fleet = Fleet(router=router, sims={"beat": sim}, world=world, publisher=publisher,
                  var_dir=var_dir)  # fmt: skip
    try:
        wait_ready(router, version)
    except BaseException:
        fleet.stop()
        raise
    return fleet


@pytest.fixture(scope="module")
def bf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    fleet = start_fleet(tmp_path_factory.mktemp("beat-var"))
    try:
        yield fleet
    finally:
        fleet.stop()


def chat(max_tokens: int, **extra: object) -> dict[str, object]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": "beat", "messages": messages, "max_tokens": max_tokens, "stream": True,
            **extra}  # fmt: skip


def client(bf: Fleet, *, base_url: str | None = None, timeout: float = 30) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {bf.key('good')}"}
    return httpx.AsyncClient(base_url=base_url or bf.base_url, headers=headers, timeout=timeout)


async def hold(bf: Fleet, tokens: int = HOLD_TOKENS) -> asyncio.Task[httpx.Response]:
    """A long stream that holds the only slot; returns once the engine runs it (after the
    previous test's holder left the engine)."""
    sim_url = bf.sims["beat"].base_url

    async def engine_runs(count: float) -> bool:
        async with httpx.AsyncClient(base_url=sim_url) as sim:
            text = (await sim.get("/metrics")).text
        return metric_value(text, "vllm:num_requests_running") == count

    await async_eventually(lambda: engine_runs(0.0), timeout=10, interval=0.05,
                           what="the engine is idle")  # fmt: skip
    http = client(bf)

    async def post() -> httpx.Response:
        async with http:
            return await http.post("/v1/chat/completions", json=chat(tokens))

    task = asyncio.create_task(post())
    await async_eventually(lambda: engine_runs(1.0), timeout=10, interval=0.05,
                           what="the holder runs")  # fmt: skip
    return task


async def queued(bf: Fleet) -> float:
    async with client(bf) as http:
        text = (await http.get("/metrics")).text
    return sum(
        float(line.rpartition(" ")[2])
        for line in text.splitlines()
        if line.startswith("switchyard_queue_length{") and 'pool="beat"' in line
    )


async def test_a_queued_stream_gets_headers_and_heartbeats_and_completes(bf: Fleet) -> None:
    holder = await hold(bf)
    # The read timeout (1 s) is far shorter than the wait (about 3 s): only the heartbeats
    # (every 200 ms) keep it.
    async with (
        client(bf, timeout=1.0) as http,
        http.stream("POST", "/v1/chat/completions", json=chat(3)) as answer,
    ):
        assert answer.status_code == 200
        assert answer.headers["content-type"].startswith("text/event-stream")
        assert answer.headers["x-switchyard-version"] == "v1"
        assert answer.headers["x-ratelimit-limit-requests"] == "1000"  # on the early headers
        lines = [line async for line in answer.aiter_lines() if line]
    comments = [line for line in lines if line.startswith(":")]
    data = [line for line in lines if line.startswith("data: ")]
    assert len(comments) >= 5, lines  # about 3 s of 200 ms beats
    assert comments[0] == ": queued position=1"
    assert lines.index(comments[-1]) < lines.index(data[0])  # heartbeats only before the output
    assert data[-1] == "data: [DONE]"
    assert any(json.loads(d[6:])["choices"][0].get("finish_reason") == "length" for d in data[:-1])
    assert (await holder).status_code == 200


async def test_the_openai_client_with_a_short_timeout_reads_a_queued_stream(bf: Fleet) -> None:
    holder = await hold(bf)
    api = openai.AsyncOpenAI(base_url=f"{bf.base_url}/v1", api_key=bf.key('good'), timeout=1.0,
                             max_retries=0)  # fmt: skip
    async with api:
        stream = await api.chat.completions.create(
            model="beat", messages=[{"role": "user", "content": "hi"}], max_tokens=3, stream=True
        )
        chunks = [chunk async for chunk in stream]
    assert chunks[-1].choices[0].finish_reason == "length"
    assert (await holder).status_code == 200


async def test_a_deadline_passing_after_the_headers_ends_the_stream_with_an_error_event(
    bf: Fleet,
) -> None:
    holder = await hold(bf)
    async with client(bf) as http:
        answer = await http.post("/v1/chat/completions", json=chat(3),
                                 headers={"X-Request-Timeout": "1"})  # fmt: skip
    assert answer.status_code == 200  # the headers went out while it was queued
    events = [block for block in answer.text.split("\n\n") if block]
    assert events[0].startswith(": queued")
    assert events[-1] == "data: [DONE]"
    terminal = json.loads(events[-2].removeprefix("data: "))
    assert terminal["object"] == "chat.completion.chunk"
    assert terminal["model"] == "beat"
    assert terminal["choices"][0]["finish_reason"] == "error"
    assert terminal["error"]["code"] == "deadline_exceeded"
    assert "queued" in terminal["error"]["message"]
    holder.cancel()


async def test_a_class_with_heartbeats_off_still_answers_504_in_json(bf: Fleet) -> None:
    holder = await hold(bf)
    async with client(bf) as http:
        answer = await http.post("/v1/chat/completions", json=chat(3), headers={
            "X-Request-Timeout": "0.5", "X-Switchyard-Class": "quiet"})  # fmt: skip
    assert answer.status_code == 504
    assert answer.json()["error"]["code"] == "deadline_exceeded"
    # A refusal after admission carries the rate-limit headers too (this one was counted).
    assert answer.headers["x-ratelimit-limit-requests"] == "1000"
    assert int(answer.headers["x-ratelimit-remaining-requests"]) < 1000
    holder.cancel()


async def test_a_client_gone_while_its_stream_is_queued_frees_its_place(bf: Fleet) -> None:
    holder = await hold(bf)
    async with (
        client(bf) as http,
        http.stream("POST", "/v1/chat/completions", json=chat(3)) as answer,
    ):
        assert answer.status_code == 200
        lines = answer.aiter_lines()
        assert (await anext(lines)).startswith(": queued")
        assert await queued(bf) == 1
    # the client closed the connection while queued

    async def empty() -> bool:
        return await queued(bf) == 0

    await async_eventually(empty, timeout=5, interval=0.05, what="the queue empties")
    holder.cancel()


@pytest.mark.timing
async def test_no_stream_breaks_behind_an_idle_cutting_proxy(bf: Fleet) -> None:
    """Issue #33's goal, scaled: proxy idle timeout 2 s, queue wait about 6 s, heartbeat 1 s.
    A stream whose class sends no heartbeats, behind the same proxy, is cut (the control)."""
    holder = await hold(bf, tokens=300)
    port = int(bf.base_url.rpartition(":")[2])
    async with IdleProxy(port, idle_s=2.0) as proxy:
        http = client(bf, base_url=proxy.base_url)

        async def one(klass: str) -> str:
            answer = await http.post("/v1/chat/completions", json=chat(2),
                                     headers={"X-Switchyard-Class": klass})  # fmt: skip
            return answer.text

        async with http:
            beating = [asyncio.create_task(one("proxied")) for _ in range(4)]
            control = asyncio.create_task(one("quiet"))
            with pytest.raises(httpx.RemoteProtocolError):
                await control
            texts = await asyncio.gather(*beating)
    assert proxy.cut == 1  # the control only
    for text in texts:
        assert text.startswith(": queued")
        assert text.endswith("data: [DONE]\n\n")
        assert '"finish_reason":"error"' not in text
    assert (await holder).status_code == 200
