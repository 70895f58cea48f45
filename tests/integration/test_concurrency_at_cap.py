"""A client that keeps exactly its concurrency cap in flight is never refused (issue #27).

The router frees a request's concurrency slot (settles its limits) before the response's last
byte goes out, so a client that sends its next request the moment a response ends finds the
slot free. A real router process over a simulator; the tenant's cap is ``CAP``; ``CAP``
client tasks each send ``ROUNDS`` requests back to back (streams and JSON alternating).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fixtures.router import Process, World, routers, start_simulator
from integration_support import tenant_limits

pytestmark = pytest.mark.integration

MODEL = "cap-chat"
CAP = 4
ROUNDS = 25


@pytest.fixture(scope="module")
def engine() -> Iterator[Process]:
    sim = start_simulator(MODEL, "--decode-a-ms", "1")
    yield sim
    sim.stop()


def world_for(engine: Process) -> World:
    world = World()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, engine.base_url, pool="shared", capacity=64)
    world.add_tenant("capped", tenant_limits=tenant_limits(concurrency=CAP))
    world.add_key("capped", "capped")
    return world


async def client_task(http: httpx.AsyncClient, url: str, index: int) -> list[tuple[int, str]]:
    """``ROUNDS`` requests, each sent as soon as the previous response ended."""
    refused: list[tuple[int, str]] = []
    for round_ in range(ROUNDS):
        stream = (index + round_) % 2 == 0
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"hi {index} {round_}"}],
            "max_tokens": 4,
            "stream": stream,
        }
        async with http.stream("POST", url, json=body) as response:
            data = await response.aread()  # the response ends here
        if response.status_code != 200:
            refused.append((response.status_code, data.decode(errors="replace")[:200]))
    return refused


@pytest.mark.timing
def test_a_client_at_its_concurrency_cap_is_never_refused(engine: Process, tmp_path: Path) -> None:
    world = world_for(engine)
    headers = {"Authorization": f"Bearer {world.secrets['capped']}"}

    async def scenario(base_url: str) -> list[tuple[int, str]]:
        limits = httpx.Limits(max_connections=CAP, max_keepalive_connections=CAP)
        async with httpx.AsyncClient(timeout=30, headers=headers, limits=limits) as http:
            url = f"{base_url}/v1/chat/completions"
            results = await asyncio.gather(*(client_task(http, url, i) for i in range(CAP)))
        return [refusal for refused in results for refusal in refused]

    with routers(world, tmp_path, count=1) as (pair, _):
        refused = asyncio.run(scenario(pair[0].base_url))
    assert refused == [], f"{len(refused)} of {CAP * ROUNDS} refused: {refused[:3]}"
