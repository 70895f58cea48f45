"""The simulator under load: /metrics, the waiting queue, priorities, disconnects, faults."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer
from fixtures.wait import async_eventually
from prometheus_client.parser import text_string_to_metric_families

from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.server import ENGINE, create_app
from runtime.workers.simulator.timing import Capacity, TimingModel

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

MODEL = "sim-sched"
LABELS = {"model_name": MODEL, "engine": "0"}


class Sim:
    def __init__(self, server: TestServer, session: aiohttp.ClientSession) -> None:
        self.server = server
        self.session = session
        self.url = f"http://127.0.0.1:{server.port}"
        self.engine = server.app[ENGINE]

    async def metrics(self) -> dict[tuple[str, frozenset], float]:
        async with self.session.get(f"{self.url}/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }

    async def metric(self, name: str, **extra: str) -> float:
        return (await self.metrics())[(name, frozenset({**LABELS, **extra}.items()))]

    async def complete(self, prompt: str = "hi", **body: object) -> dict:
        payload = {"model": MODEL, "prompt": prompt, **body}
        async with self.session.post(f"{self.url}/v1/completions", json=payload) as resp:
            assert resp.status == 200, await resp.text()
            return await resp.json()

    async def stream_times(self, prompt: str = "hi", **body: object) -> tuple[float, float]:
        """(time to first content chunk, time to [DONE]) as the client sees them."""
        payload = {"model": MODEL, "prompt": prompt, "stream": True, **body}
        start = time.monotonic()
        first = None
        async with self.session.post(f"{self.url}/v1/completions", json=payload) as resp:
            async for line in resp.content:
                if first is None and line.startswith(b"data: {"):
                    first = time.monotonic() - start
        assert first is not None
        return first, time.monotonic() - start


@pytest_asyncio.fixture
async def make_sim():
    servers: list[TestServer] = []
    session = aiohttp.ClientSession()

    async def _make(*, a_ms: float = 2, b_ms: float = 0, prefill_tps: float = 1e6,
                    max_num_seqs: int = 8, kv: int = 8192, max_model_len: int = 1024,
                    fail_after: int | None = None) -> Sim:  # fmt: skip
        config = SimulatorConfig(
            model=MODEL,
            timing=TimingModel(prefill_tps=prefill_tps, decode_a_ms=a_ms, decode_b_ms=b_ms),
            capacity=Capacity(max_num_seqs=max_num_seqs, kv_capacity_tokens=kv),
            max_model_len=max_model_len,
            fail_after_tokens=fail_after,
        )
        server = TestServer(create_app(config), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return Sim(server, session)

    yield _make
    await session.close()
    for server in servers:
        await server.close()


async def test_metrics_expose_vllm_names_and_move(make_sim):
    sim = await make_sim()
    text_before = await sim.metrics()
    names = [
        "vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc",
        "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds_count", "vllm:inter_token_latency_seconds_count",
        "vllm:e2e_request_latency_seconds_count", "vllm:request_queue_time_seconds_count",
    ]  # fmt: skip
    before = {name: text_before[(name, frozenset(LABELS.items()))] for name in names}
    assert before == dict.fromkeys(names, 0.0)
    await sim.complete("abcd" * 10, max_tokens=5)
    assert await sim.metric("vllm:prompt_tokens_total") == 10
    assert await sim.metric("vllm:generation_tokens_total") == 5
    assert await sim.metric("vllm:time_to_first_token_seconds_count") == 1
    assert await sim.metric("vllm:inter_token_latency_seconds_count") == 4
    assert await sim.metric("vllm:e2e_request_latency_seconds_count") == 1
    assert await sim.metric("vllm:request_success_total", finished_reason="length") == 1
    assert await sim.metric("vllm:time_to_first_token_seconds_bucket", le="+Inf") == 1


async def test_gauges_show_the_running_batch_and_its_kv(make_sim):
    sim = await make_sim(a_ms=5, kv=1000, max_model_len=1000)
    task = asyncio.create_task(sim.complete("abcd" * 100, max_tokens=150))  # reserves 250
    await async_eventually(lambda: sim.engine.num_running == 1, timeout=5.0, interval=0.002)
    assert await sim.metric("vllm:num_requests_running") == 1
    assert await sim.metric("vllm:kv_cache_usage_perc") == pytest.approx(0.25)
    await task
    assert await sim.metric("vllm:num_requests_running") == 0
    assert await sim.metric("vllm:kv_cache_usage_perc") == 0


async def test_queue_builds_beyond_max_num_seqs_and_priority_is_honoured(make_sim):
    sim = await make_sim(a_ms=10, max_num_seqs=1)
    finished: list[str] = []

    async def run(name: str, priority: int, tokens: int = 3) -> None:
        await sim.complete(name, max_tokens=tokens, priority=priority)
        finished.append(name)

    tasks = [asyncio.create_task(run("head", 0, tokens=20))]
    await async_eventually(lambda: sim.engine.num_running == 1, timeout=5.0, interval=0.002)
    for i, (name, priority) in enumerate([("late", 5), ("urgent", -1), ("normal", 0)]):
        tasks.append(asyncio.create_task(run(name, priority)))
        await async_eventually(
            lambda i=i: sim.engine.num_waiting == i + 1, timeout=5.0, interval=0.002
        )
    assert await sim.metric("vllm:num_requests_waiting") == 3
    assert await sim.metric("vllm:num_requests_running") == 1
    await asyncio.gather(*tasks)
    assert finished == ["head", "urgent", "normal", "late"]
    assert await sim.metric("vllm:num_requests_waiting") == 0
    assert await sim.metric("vllm:request_queue_time_seconds_count") == 4


async def test_kv_capacity_makes_requests_wait(make_sim):
    sim = await make_sim(a_ms=5, kv=300, max_model_len=300)
    first = asyncio.create_task(sim.complete("abcd" * 100, max_tokens=100))  # 200 of 300
    await async_eventually(lambda: sim.engine.num_running == 1, timeout=5.0, interval=0.002)
    second = asyncio.create_task(sim.complete("abcd" * 100, max_tokens=100))
    await async_eventually(lambda: sim.engine.num_waiting == 1, timeout=5.0, interval=0.002)
    assert await sim.metric("vllm:num_requests_running") == 1  # max_num_seqs is 8
    await asyncio.gather(first, second)


async def test_ttft_grows_with_the_queue(make_sim):
    sim = await make_sim(a_ms=10, max_num_seqs=2)
    results = await asyncio.gather(*(sim.stream_times(f"p{i}", max_tokens=10) for i in range(6)))
    ttfts = sorted(first for first, _ in results)
    # Two run at once: the first pair waits ~1 step, the last pair ~2 full requests (~20 steps).
    assert ttfts[-1] > ttfts[0] + 0.1
    assert ttfts[-1] >= 0.2 - 0.02
    assert max(total for _, total in results) < 10


async def test_timing_model_prefill_and_decode_are_honoured(make_sim):
    sim = await make_sim(a_ms=20, prefill_tps=1000)
    first, total = await sim.stream_times("abcd" * 200, max_tokens=5)  # 200 prompt tokens
    assert first >= 0.2 + 0.02 - 0.01  # prefill 0.2 s + one 20 ms decode step
    assert total >= first + 4 * 0.02 - 0.01
    assert total < 5


async def test_client_disconnect_frees_the_slot(make_sim):
    sim = await make_sim(a_ms=5, max_num_seqs=1)
    payload = {"model": MODEL, "prompt": "hi", "max_tokens": 1000, "stream": True}
    async with aiohttp.ClientSession() as own:
        resp = await own.post(f"{sim.url}/v1/completions", json=payload)
        await resp.content.readline()  # the first chunk arrived: the sequence is running
        waiting = asyncio.create_task(sim.complete("queued", max_tokens=1000))
        await async_eventually(lambda: sim.engine.num_waiting == 1, timeout=5.0, interval=0.002)
        assert await sim.metric("vllm:num_requests_running") == 1
        waiting.cancel()  # drops the waiting client too
        resp.close()
    await async_eventually(
        lambda: sim.engine.num_running == 0 and sim.engine.num_waiting == 0,
        timeout=5.0,
        interval=0.002,
    )
    assert await sim.metric("vllm:num_requests_running") == 0
    assert await sim.metric("vllm:num_requests_waiting") == 0
    assert await sim.metric("vllm:kv_cache_usage_perc") == 0
    assert await sim.metric("vllm:request_success_total", finished_reason="abort") == 2
    assert (await sim.complete(max_tokens=2))["usage"]["completion_tokens"] == 2


async def test_fail_after_tokens_cuts_a_stream_midway(make_sim):
    sim = await make_sim(fail_after=4)
    payload = {"model": MODEL, "prompt": "hi", "max_tokens": 20, "stream": True}
    frames: list[bytes] = []

    async def read_stream() -> None:
        async with sim.session.post(f"{sim.url}/v1/completions", json=payload) as resp:
            assert resp.status == 200
            async for line in resp.content:
                if line.startswith(b"data: "):
                    frames.append(line)  # noqa: PERF401 - keeps what came before the cut

    with pytest.raises(aiohttp.ClientPayloadError):
        await read_stream()
    assert len(frames) == 4
    assert b"[DONE]" not in b"".join(frames)
    await async_eventually(lambda: sim.engine.num_running == 0, timeout=5.0, interval=0.002)
    assert await sim.metric("vllm:request_success_total", finished_reason="abort") == 1


async def test_fail_after_tokens_drops_a_unary_response(make_sim):
    sim = await make_sim(fail_after=4)
    payload = {"model": MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 9}
    with pytest.raises(aiohttp.ServerDisconnectedError):
        async with sim.session.post(f"{sim.url}/v1/chat/completions", json=payload) as resp:
            await resp.read()
    assert (await sim.complete(max_tokens=4))["choices"][0]["finish_reason"] == "length"


async def test_fail_after_zero_tokens_fails_before_any_token(make_sim):
    sim = await make_sim(fail_after=0)
    payload = {"model": MODEL, "prompt": "hi", "max_tokens": 3, "stream": True}
    with pytest.raises(aiohttp.ClientPayloadError):
        async with sim.session.post(f"{sim.url}/v1/completions", json=payload) as resp:
            assert await resp.read() == b""
