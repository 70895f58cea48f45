"""Autoscaling through a real router process: it publishes per-pool signals to Redis, holds a
request for a version its pool scales from zero until a replica appears, and answers 503 with
Retry-After when the request's deadline cannot cover the measured start time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import httpx
import msgspec
import pytest
import redis
from fixtures.router import World, redis_url, routers, start_simulator
from fixtures.wait import eventually

from runtime.contract import namespace_of, scaling_signals_key
from runtime.scaling.publisher import parse_entries
from runtime.scaling.signals import aggregate

pytestmark = pytest.mark.integration
MODEL = "zero-chat"


def world_without_replicas(cold_start_s: float) -> World:
    world = World()
    world.add_model(MODEL, 1, scale_pool="sim", cold_start_s=cold_start_s)
    world.add_pool("sim", min_replicas=0, max_replicas=2)
    world.add_tenant("acme", classes=("short",))
    world.add_key("acme", "acme")
    world.add_class("short", band=0, deadline_ms=2000)
    return world


def chat(max_tokens: int = 4) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens}  # fmt: skip


def test_deadline_shorter_than_the_cold_start_gets_503_with_retry_after(tmp_path: Path) -> None:
    world = world_without_replicas(cold_start_s=7.2)
    headers = {"Authorization": f"Bearer {world.secrets['acme']}", "X-Switchyard-Class": "short"}
    with routers(world, tmp_path) as ((router,), _):
        resp = httpx.post(f"{router.base_url}/v1/chat/completions", json=chat(), headers=headers)
    assert resp.status_code == 503, resp.text
    assert resp.headers["retry-after"] == "8"
    error = resp.json()["error"]
    assert error["code"] == "no_healthy_endpoint"
    assert "about 8 s" in error["message"]


def test_an_adapter_on_a_base_at_zero_gets_the_same_503_with_retry_after(tmp_path: Path) -> None:
    """A LoRA adapter runs on its base's replicas: the snapshot gives it the base's
    scale-from-zero pool and start time (apps/core/selectors.py), and the router treats it
    like the base (not 503 "none is ready" at once)."""
    world = world_without_replicas(cold_start_s=7.2)
    world.add_adapter(f"{MODEL}-lora", 2, base_version=1, scale_pool="sim", cold_start_s=7.2)
    headers = {"Authorization": f"Bearer {world.secrets['acme']}", "X-Switchyard-Class": "short"}
    body = {**chat(), "model": f"{MODEL}-lora"}
    with routers(world, tmp_path) as ((router,), _):
        resp = httpx.post(f"{router.base_url}/v1/chat/completions", json=body, headers=headers)
    assert resp.status_code == 503, resp.text
    assert resp.headers["retry-after"] == "8"
    assert "about 8 s" in resp.json()["error"]["message"]


def test_held_while_a_replica_starts_then_served_and_signals_published(tmp_path: Path) -> None:
    world = world_without_replicas(cold_start_s=1.0)
    headers = {"Authorization": f"Bearer {world.secrets['acme']}"}
    sim = start_simulator(MODEL, "--decode-a-ms", "5")
    client = redis.Redis.from_url(redis_url())
    try:
        with routers(world, tmp_path, SWITCHYARD_SCALING_SIGNALS_S="0.2") as ((router,), pub):
            key = scaling_signals_key(namespace_of(pub.prefix), "sim")

            async def scenario() -> httpx.Response:
                async with httpx.AsyncClient(timeout=30) as http:
                    request = asyncio.create_task(
                        http.post(
                            f"{router.base_url}/v1/chat/completions", json=chat(), headers=headers
                        )
                    )

                    def queued() -> bool:
                        raw = client.hgetall(key)
                        return aggregate("sim", parse_entries(raw, now=time.time(), stale_s=5)
                                         ).queued_total == 1  # fmt: skip

                    # What the autoscaler reads: one request waiting in the empty pool.
                    await asyncio.to_thread(
                        eventually, queued, timeout=10, what="the held request in the signals"
                    )
                    assert not request.done()
                    world.add_endpoint(11, 1, sim.base_url, pool="sim")  # the replica is up
                    pub.publish(world.snapshot())
                    return await request

            resp = asyncio.run(scenario())
            assert resp.status_code == 200, resp.text
            assert resp.json()["usage"]["completion_tokens"] == 4

            def dispatched() -> bool:
                raw = client.hgetall(key)
                entries = [msgspec.json.decode(v) for v in raw.values()]
                return any(e["inflight"] == 0 and not e["queued"] for e in entries)

            eventually(dispatched, timeout=10, what="signals after the request was served")
    finally:
        client.close()
        sim.stop()
