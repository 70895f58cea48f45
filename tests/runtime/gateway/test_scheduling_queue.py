"""The router's pool queue over HTTP: deadline-aware 429 with position, full band, shedding,
504 for a deadline that passes in the queue, disconnect while queued, and the metrics.

Each test has its own model on its own one-slot simulator (one sequence at a time, the
router's capacity 1), so a long stream holds the slot and later requests queue in the router.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import msgspec
import pytest
from fixtures.router import Process, Publisher, World, metric_value, start_router, wait_ready
from fixtures.wait import async_eventually
from gateway_fleet import start_simulator

from runtime.snapshot import RequestClassSnap

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

CASES = ("deadline", "full", "shed", "expire", "cancel")
HOLD_TOKENS = 150  # 20 ms per token: the slot is held for about 3 s


def klass(
    name: str, *, band: int, deadline_ms: int, max_queue: int, shed_order: int
) -> RequestClassSnap:
    return RequestClassSnap(
        name=name, priority_band=band, ttft_slo_ms=1000, deadline_ms=deadline_ms,
        max_queue_length=max_queue, shed_order=shed_order,
    )  # fmt: skip


class QueueFleet:
    def __init__(self, var_dir: Path) -> None:
        self.publisher = Publisher(f"switchyard:test:gw-queue:{uuid.uuid4().hex[:10]}")
        self.world = World()
        self.sims: dict[str, Process] = {}
        self.router: Process | None = None
        self.var_dir = var_dir

    def start(self) -> None:
        world = self.world
        world.classes["interactive"] = klass("interactive", band=0, deadline_ms=60_000,
                                             max_queue=50, shed_order=2)  # fmt: skip
        world.classes["standard"] = klass("standard", band=1, deadline_ms=60_000,
                                          max_queue=2, shed_order=1)  # fmt: skip
        world.classes["batch"] = klass("batch", band=2, deadline_ms=60_000, max_queue=50,
                                       shed_order=0)  # fmt: skip
        world.add_tenant("acme", classes=("interactive", "standard", "batch"),
                         default_class="interactive")  # fmt: skip
        world.add_key("good", "acme")
        world.add_tenant("streamer", classes=("interactive",), default_class="interactive")
        world.add_key("streamer", "streamer")
        for index, case in enumerate(CASES, start=1):
            self.sims[case] = start_simulator(f"q-{case}", "--max-num-seqs", "1",
                                              "--decode-a-ms", "20")  # fmt: skip
            world.add_model(f"q-{case}", index)
            world.add_endpoint(index, index, self.sims[case].base_url, pool=case, capacity=1)
        world.pools["shed"] = msgspec.structs.replace(
            world.pools["shed"], policies={"max_queue": "3"}
        )
        version = self.publisher.publish(world.snapshot())
        self.router = start_router(self.publisher.prefix, self.var_dir)
        wait_ready(self.router, version)

    @property
    def base_url(self) -> str:
        assert self.router is not None
        return self.router.base_url

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        for sim in self.sims.values():
            sim.stop()
        self.publisher.cleanup()


@pytest.fixture(scope="module")
def qf(tmp_path_factory: pytest.TempPathFactory) -> Iterator[QueueFleet]:
    fleet = QueueFleet(tmp_path_factory.mktemp("queue-var"))
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def chat(case: str, max_tokens: int = 1, **extra: object) -> dict[str, object]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": f"q-{case}", "messages": messages, "max_tokens": max_tokens, **extra}


async def hold(http: httpx.AsyncClient, qf: QueueFleet, case: str) -> asyncio.Task[httpx.Response]:
    """A long stream that holds the case's only slot; returns once the engine runs it."""
    task = asyncio.create_task(
        http.post("/v1/chat/completions", json=chat(case, HOLD_TOKENS, stream=True))
    )

    async def running() -> bool:
        async with httpx.AsyncClient(base_url=qf.sims[case].base_url) as sim:
            text = (await sim.get("/metrics")).text
        return metric_value(text, "vllm:num_requests_running") == 1.0

    await async_eventually(running, timeout=10, interval=0.05, what=f"the {case} holder runs")
    return task


async def wait_queued(http: httpx.AsyncClient, pool: str, count: int) -> None:
    """Wait (bounded) until the router's queue for ``pool`` holds ``count`` requests."""

    async def reached() -> bool:
        return queued(await metrics(http), pool) == count

    await async_eventually(reached, timeout=10, interval=0.05, what=f"{count} queued in {pool}")


def queued(text: str, pool: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith("switchyard_queue_length{") and f'pool="{pool}"' in line:
            total += float(line.rpartition(" ")[2])
    return total


def client(qf: QueueFleet) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {qf.world.secrets['good']}"}
    return httpx.AsyncClient(base_url=qf.base_url, headers=headers, timeout=30)


async def test_a_wait_beyond_the_deadline_is_a_429_with_position_and_retry_after(
    qf: QueueFleet,
) -> None:
    async with client(qf) as http:
        holder = await hold(http, qf, "deadline")
        waiting = [
            asyncio.create_task(http.post("/v1/chat/completions", json=chat("deadline", 400)))
            for _ in range(3)
        ]
        await wait_queued(http, "deadline", 3)
        # A less urgent class: all three interactive requests go before it.
        refused = await http.post(
            "/v1/chat/completions", json=chat("deadline", 400),
            headers={"X-Request-Timeout": "1", "X-Switchyard-Class": "standard"},
        )  # fmt: skip
        assert refused.status_code == 429
        error = refused.json()["error"]
        assert error["code"] == "wait_exceeds_deadline"
        assert error["type"] == "rate_limit_error"
        assert error["queue_position"] == 4  # three queued ahead of it
        assert error["estimated_wait_s"] > 1.0
        retry_after = int(refused.headers["retry-after"])
        assert error["estimated_wait_s"] <= retry_after < error["estimated_wait_s"] + 1.01
        assert 1 < retry_after <= 60
        for task in waiting:
            task.cancel()
        holder.cancel()


async def test_a_full_band_is_a_429_queue_full(qf: QueueFleet) -> None:
    async with client(qf) as http:
        holder = await hold(http, qf, "full")
        standard = {"X-Switchyard-Class": "standard"}  # at most 2 queued in its band
        waiting = [
            asyncio.create_task(
                http.post("/v1/chat/completions", json=chat("full"), headers=standard)
            )
            for _ in range(2)
        ]
        await wait_queued(http, "full", 2)
        refused = await http.post("/v1/chat/completions", json=chat("full"), headers=standard)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "queue_full"
        assert refused.json()["error"]["queue_position"] == 3
        assert int(refused.headers["retry-after"]) >= 1
        holder.cancel()
        for task in waiting:
            assert (await task).status_code == 200  # served once the slot frees


async def test_under_overload_batch_is_shed_for_interactive(qf: QueueFleet) -> None:
    async with client(qf) as http:
        holder = await hold(http, qf, "shed")
        batch = {"X-Switchyard-Class": "batch"}
        waiting = [
            asyncio.create_task(http.post("/v1/chat/completions", json=chat("shed"),
                                          headers=batch))
            for _ in range(3)
        ]  # fmt: skip
        await wait_queued(http, "shed", 3)  # the pool queue (max_queue 3) is full of batch work
        urgent = asyncio.create_task(http.post("/v1/chat/completions", json=chat("shed")))
        await async_eventually(lambda: any(t.done() for t in waiting), timeout=10, what="a shed")
        shed = [t for t in waiting if t.done()]
        assert len(shed) == 1  # the newest batch request gave way
        answer = shed[0].result()
        assert answer.status_code == 429
        assert answer.json()["error"]["code"] == "shed"
        assert int(answer.headers["retry-after"]) >= 1
        holder.cancel()
        assert (await urgent).status_code == 200
        for task in waiting:
            if task is not shed[0]:
                assert (await task).status_code == 200


async def test_a_deadline_passing_in_the_queue_is_a_504_before_any_engine(
    qf: QueueFleet,
) -> None:
    async with client(qf) as http:
        holder = await hold(http, qf, "expire")
        expired = await http.post(
            "/v1/chat/completions", json=chat("expire"), headers={"X-Request-Timeout": "0.5"}
        )
        assert expired.status_code == 504
        error = expired.json()["error"]
        assert error["code"] == "deadline_exceeded"
        assert "queued" in error["message"]
        assert "before dispatch" in error["message"]
        holder.cancel()
        text = await metrics(http)
        assert 'switchyard_rejections_total{reason="deadline_exceeded"}' in text
        async with httpx.AsyncClient(base_url=qf.sims["expire"].base_url) as sim:
            engine = (await sim.get("/metrics")).text
        # The engine only ever started the holder (the expired request never reached it).
        assert metric_value(engine, "vllm:time_to_first_token_seconds_count") == 1.0


async def metrics(http: httpx.AsyncClient) -> str:
    return (await http.get("/metrics")).text


async def test_a_client_gone_while_queued_leaves_the_queue_at_once(qf: QueueFleet) -> None:
    async with client(qf) as http:
        holder = await hold(http, qf, "cancel")
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/v1/chat/completions", json=chat("cancel"), timeout=0.5)
        await wait_queued(http, "cancel", 0)
        holder.cancel()
        text = await metrics(http)
        for name in (
            "switchyard_queue_wait_seconds_bucket",
            "switchyard_served_tokens_total",
            "switchyard_tenant_share",
            "switchyard_fairness_jain_index",
            "switchyard_fairness_counter",
        ):
            assert name in text, name


def sample(text: str, name: str, **labels: str) -> float:
    """The value of the sample ``name`` whose labels include ``labels`` (0 if none)."""
    for line in text.splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] == name and all(f'{k}="{v}"' in head for k, v in labels.items()):
            return float(value)
    return 0.0


async def test_streamed_output_is_charged_to_the_tenant(qf: QueueFleet) -> None:
    headers = {"Authorization": f"Bearer {qf.world.secrets['streamer']}"}
    async with httpx.AsyncClient(base_url=qf.base_url, headers=headers, timeout=30) as http:
        answer = await http.post(
            "/v1/chat/completions", json=chat("cancel", 20, stream=True,
                                              stream_options={"include_usage": True}),
        )  # fmt: skip
        assert answer.status_code == 200
        usage = json.loads(answer.text.split("data: ")[-2])["usage"]
        text = await metrics(http)
    labels = {"pool": "cancel", "tenant": "streamer"}
    assert sample(text, "switchyard_served_tokens_total", kind="output", **labels) == 20
    assert sample(text, "switchyard_served_tokens_total", kind="input", **labels) > 0
    counter = sample(text, "switchyard_fairness_counter", band="0", **labels)
    # VTC's charge: the prompt (the router's estimate) at dispatch + 2 per output token.
    assert counter >= 2 * usage["completion_tokens"] + 1
