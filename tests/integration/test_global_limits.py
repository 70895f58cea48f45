"""Two router processes sharing one Redis: one global RPM limit, one global concurrency cap,
shared fairness counters; a 429 carries a sensible Retry-After."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fixtures.router import Process, World, http_get, metric_value, routers, start_simulator
from fixtures.wait import async_eventually, eventually
from integration_support import tenant_limits

pytestmark = pytest.mark.integration

MODEL = "limits-chat"
RPM = 10


@pytest.fixture(scope="module")
def engine() -> Iterator[Process]:
    sim = start_simulator(MODEL, "--decode-a-ms", "5")
    yield sim
    sim.stop()


def world_for(engine: Process) -> World:
    world = World()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, engine.base_url, pool="shared", capacity=16)
    world.add_tenant("metered", tenant_limits=tenant_limits(rpm=RPM))
    world.add_tenant("narrow", tenant_limits=tenant_limits(concurrency=2))
    world.add_tenant("busy")
    for tenant in ("metered", "narrow", "busy"):
        world.add_key(tenant, tenant)
    return world


def engine_running(engine: Process) -> float | None:
    """The simulator's running requests (its /metrics)."""
    _, body = http_get(f"{engine.base_url}/metrics")
    return metric_value(body.decode(), "vllm:num_requests_running")


def chat(max_tokens: int = 2, **extra: object) -> dict[str, object]:
    messages = [{"role": "user", "content": "hi"}]
    return {"model": MODEL, "messages": messages, "max_tokens": max_tokens, **extra}


def test_two_routers_enforce_one_rpm_limit_with_a_sensible_retry_after(
    engine: Process, tmp_path: Path
) -> None:
    world = world_for(engine)
    headers = {"Authorization": f"Bearer {world.secrets['metered']}"}
    with routers(world, tmp_path, count=2) as (pair, _):
        started = time.monotonic()
        answers = [
            httpx.post(f"{pair[i % 2].base_url}/v1/chat/completions", json=chat(),
                       headers=headers, timeout=30)
            for i in range(2 * RPM)
        ]  # fmt: skip
        elapsed = time.monotonic() - started
        assert elapsed < 30  # all inside one window
        ok = [a for a in answers if a.status_code == 200]
        refused = [a for a in answers if a.status_code == 429]
        assert len(ok) == RPM, [a.status_code for a in answers]
        assert len(refused) == RPM
        assert {i % 2 for i, a in enumerate(answers) if a.status_code == 200} == {0, 1}
        for answer in refused:
            error = answer.json()["error"]
            assert error["code"] == "rate_limit_exceeded"
            assert error["type"] == "rate_limit_error"
            assert f"{RPM} requests per minute" in error["message"]
            retry_after = int(answer.headers["retry-after"])
            # The oldest admission leaves the 60 s window this many seconds from now.
            assert 60 - elapsed - 2 <= retry_after <= 60
        other = {"Authorization": f"Bearer {world.secrets['busy']}"}
        assert httpx.post(f"{pair[0].base_url}/v1/chat/completions", json=chat(),
                          headers=other, timeout=30).status_code == 200  # fmt: skip


def test_two_routers_enforce_one_concurrency_cap(engine: Process, tmp_path: Path) -> None:
    world = world_for(engine)
    headers = {"Authorization": f"Bearer {world.secrets['narrow']}"}

    async def scenario(pair: list[Process]) -> list[httpx.Response]:
        async with httpx.AsyncClient(timeout=30, headers=headers) as http:
            # Two long streams hold the tenant's two slots, one through each router.
            long = [
                asyncio.create_task(http.post(f"{pair[i].base_url}/v1/chat/completions",
                                              json=chat(max_tokens=300, stream=True)))
                for i in (0, 1)
            ]  # fmt: skip
            await async_eventually(lambda: engine_running(engine) == 2, timeout=10)
            late = [
                await http.post(f"{router.base_url}/v1/chat/completions", json=chat())
                for router in pair
            ]
            for task in long:
                assert (await task).status_code == 200

            # Both slots are back once the streams end (settled through Redis).
            async def slot_free() -> bool:
                again = await http.post(f"{pair[1].base_url}/v1/chat/completions", json=chat())
                return again.status_code == 200

            await async_eventually(slot_free, timeout=5, interval=0.05, what="a free slot")
            return late

    with routers(world, tmp_path, count=2) as (pair, _):
        late = asyncio.run(scenario(pair))
    for answer in late:
        assert answer.status_code == 429
        assert answer.json()["error"]["code"] == "concurrency_limit_exceeded"
        assert answer.headers["retry-after"] == "1"


def test_fairness_counters_are_shared_between_routers(engine: Process, tmp_path: Path) -> None:
    world = world_for(engine)
    headers = {"Authorization": f"Bearer {world.secrets['busy']}"}
    with routers(world, tmp_path, count=2) as (pair, _):
        for _ in range(5):
            answer = httpx.post(f"{pair[0].base_url}/v1/chat/completions",
                                json=chat(max_tokens=20), headers=headers, timeout=30)  # fmt: skip
            assert answer.status_code == 200
        # Router two never served "busy", but its counter follows router one's service after
        # a sync (pushed within a second, read while its queue is busy or on its next push).
        seen = local = 0.0

        def synced() -> bool:
            nonlocal seen, local
            text = httpx.get(f"{pair[0].base_url}/metrics", timeout=5).text
            local = metric_value(text, "switchyard_fairness_counter") or 0.0
            # Router two learns of the pool when a request reaches it.
            other = {"Authorization": f"Bearer {world.secrets['metered']}"}
            httpx.post(f"{pair[1].base_url}/v1/chat/completions", json=chat(), headers=other,
                       timeout=30)  # fmt: skip
            text = httpx.get(f"{pair[1].base_url}/metrics", timeout=5).text
            seen = sum(
                float(line.rpartition(" ")[2])
                for line in text.splitlines()
                if line.startswith("switchyard_fairness_counter{") and 'tenant="busy"' in line
            )
            return local > 0 and seen >= local

        with contextlib.suppress(AssertionError):
            eventually(synced, timeout=10, interval=0.3)
        assert local > 0
        assert seen >= local
