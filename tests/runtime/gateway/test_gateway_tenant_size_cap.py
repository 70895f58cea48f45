"""A tenant's own request-size cap (``Tenant.max_request_bytes``, DESIGN §6): 413 above it."""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from gateway_fleet import CHAT_MODEL, Fleet, Publisher, free_port, inprocess_router, standard_world

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

CAP = 600


@pytest_asyncio.fixture
async def router(fleet: Fleet, tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, str]]]:
    publisher = Publisher(f"switchyard:test:gw-sizecap:{uuid.uuid4().hex[:8]}")
    world = standard_world(fleet.sims, free_port())
    world.add_tenant("capped", max_request_bytes=CAP)
    world.add_key("capped", "capped")
    publisher.publish(world.snapshot())
    try:
        async with inprocess_router(publisher.router_config(tmp_path)) as base_url:
            yield base_url, world.secrets
    finally:
        publisher.cleanup()


def body_of(size: int) -> bytes:
    """A chat request of exactly ``size`` bytes."""
    shell = {"model": CHAT_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": ""}]}
    padding = size - len(json.dumps(shell).encode())
    shell["messages"][0]["content"] = "x" * padding
    body = json.dumps(shell).encode()
    assert len(body) == size
    return body


async def post(base_url: str, key: str, body: bytes) -> httpx.Response:
    headers = {"Authorization": f"Bearer {key}", "Content-Type": "application/json"}
    async with httpx.AsyncClient(timeout=30) as client:
        return await client.post(f"{base_url}/v1/chat/completions", content=body, headers=headers)


async def test_a_body_over_the_tenants_cap_is_refused_with_413(
    router: tuple[str, dict[str, str]],
) -> None:
    base_url, keys = router
    resp = await post(base_url, keys["capped"], body_of(CAP + 1))
    assert resp.status_code == 413, resp.text
    assert resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_too_large")
    assert str(CAP) in error["message"]


async def test_a_body_at_the_cap_passes_and_other_tenants_keep_the_routers_cap(
    router: tuple[str, dict[str, str]],
) -> None:
    base_url, keys = router
    at_cap = await post(base_url, keys["capped"], body_of(CAP))
    assert at_cap.status_code == 200, at_cap.text
    uncapped = await post(base_url, keys["good"], body_of(CAP * 4))
    assert uncapped.status_code == 200, uncapped.text
