"""The router in this process (uvicorn.Server on the test's event loop), with Django's
settings configured with a Redis channel layer (pytest-django loads config.settings): the
Channels flavour's consumers must still build no channel layer and make no database thread
hop per request.
"""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import channels.consumer
import channels.generic.http
import httpx
import openai
import pytest
import pytest_asyncio
from channels.layers import channel_layers
from django.conf import settings
from gateway_fleet import (
    CHAT_MODEL,
    Fleet,
    Publisher,
    free_port,
    inprocess_router,
    redis_url,
    standard_world,
)

from runtime.gateway import app as gateway_app
from runtime.gateway.app import create_app
from runtime.gateway.config import RouterConfig
from runtime.upstream import HealthConfig

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@contextlib.asynccontextmanager
async def world_router(
    fleet: Fleet, tmp_path: Path, name: str, router_http: str = "asgi"
) -> AsyncIterator[tuple[str, str]]:
    """An in-process router over the standard world (a fresh prefix); (base URL, good key)."""
    publisher = Publisher(f"switchyard:test:{name}:{uuid.uuid4().hex[:8]}")
    world = standard_world(fleet.sims, free_port())
    publisher.publish(world.snapshot())
    config = RouterConfig(
        redis_url=redis_url(),
        snapshot_prefix=publisher.prefix,
        snapshot_cache_path=tmp_path / "router-snapshot.json",
        key_usage_hash=f"{publisher.prefix}:apikey:last_used",
        router_http=router_http,
    )
    try:
        async with inprocess_router(config) as base_url:
            yield base_url, world.secrets["good"]
    finally:
        publisher.cleanup()


@pytest_asyncio.fixture
async def channels_router(fleet: Fleet, tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """The Channels flavour of the HTTP entry (SWITCHYARD_ROUTER_HTTP=channels): the only one
    with Channels' code on the request path at all."""
    async with world_router(fleet, tmp_path, "gw-inproc-ch", router_http="channels") as served:
        yield served


async def test_no_channel_layer_and_no_db_hop_per_request(
    channels_router: tuple[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    base_url, key = channels_router
    assert settings.CHANNEL_LAYERS["default"]["BACKEND"] == "channels_redis.core.RedisChannelLayer"
    calls: list[str] = []

    def counting(
        where: str, original: Callable[[], Awaitable[Any]]
    ) -> Callable[[], Awaitable[Any]]:
        async def wrapper() -> Any:
            calls.append(where)
            return await original()

        return wrapper

    for module in (channels.consumer, channels.generic.http):
        monkeypatch.setattr(
            module,
            "aclose_old_connections",
            counting(module.__name__, module.aclose_old_connections),
        )
    backends_before = dict(channel_layers.backends)

    client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    for _ in range(3):
        result = await client.chat.completions.create(
            model=CHAT_MODEL, messages=messages, max_tokens=2
        )
        assert result.choices[0].message.content
    stream = await client.chat.completions.create(
        model=CHAT_MODEL, messages=messages, max_tokens=3, stream=True
    )
    assert len([chunk async for chunk in stream]) >= 3
    async with httpx.AsyncClient(base_url=base_url, timeout=10) as http:
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.post("/v1/chat/completions", content=b"{")).status_code == 401
    await client.close()

    assert calls == []
    assert dict(channel_layers.backends) == backends_before


async def test_a_stall_while_the_heap_settles_refuses_no_request(
    fleet: Fleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """CI: in the suite's large process, start-up's full collection blocked the loop for longer
    than a probe's timeout while the first probes were out; both chat endpoints were refused
    (503 no_healthy_endpoint) until their next answer. The stall is played by sleeping in it."""
    settle = gateway_app.settle_heap

    def large_heap() -> None:
        settle()
        time.sleep(HealthConfig().probe_timeout_s * 1.5)

    monkeypatch.setattr(gateway_app, "settle_heap", large_heap)
    async with world_router(fleet, tmp_path, "gw-stall") as (base_url, key):
        client = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)
        try:
            result = await client.chat.completions.create(
                model=CHAT_MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2
            )
        finally:
            await client.close()
        assert result.choices[0].message.content


async def test_http_before_lifespan_answers_not_ready(tmp_path: Path) -> None:
    app = create_app(RouterConfig(snapshot_cache_path=tmp_path / "s.json"))
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "GET", "path": "/healthz", "headers": [], "state": {}}
    await app(scope, receive, send)
    assert sent[0]["status"] == 503
    assert b'"not_ready"' in sent[1]["body"]
