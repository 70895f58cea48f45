"""Tenant limits over HTTP: the 429 answers, and the fallback to local limits when Redis dies.

The router here talks to a private ``redis-server`` (snapshot, limits, fairness), so the test
can kill it while the router runs.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fixtures import redis_server
from fixtures.router import (
    Process,
    Publisher,
    World,
    limits,
    start_router,
    wait_ready,
)
from fixtures.wait import eventually
from gateway_fleet import start_simulator

from config.embedded import EmbeddedRedis
from runtime.gateway.config import ConfigError, RouterConfig
from runtime.snapshot import TenantLimits

pytestmark = pytest.mark.integration

MODEL = "limit-chat"


@pytest.fixture
def private_redis(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    with redis_server.private_redis(tmp_path) as server:
        yield server


@pytest.fixture(scope="module")
def engine() -> Iterator[Process]:
    sim = start_simulator(MODEL, "--decode-a-ms", "2")
    yield sim
    sim.stop()


def tenant_limits(*, rpm: int = 1000, tpm: int = 1_000_000) -> TenantLimits:
    base = limits()
    return TenantLimits(
        rpm=rpm, tpm=tpm, max_concurrency=base.max_concurrency,
        max_context_tokens=base.max_context_tokens, max_output_tokens=base.max_output_tokens,
    )  # fmt: skip


def chat(max_tokens: int = 2) -> dict[str, object]:
    return {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": max_tokens}  # fmt: skip


def world_for(engine: Process) -> World:
    world = World()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, engine.base_url, pool="limits", capacity=8)
    world.add_tenant("six", tenant_limits=tenant_limits(rpm=6))
    world.add_tenant("thrifty", tenant_limits=tenant_limits(tpm=100))
    world.add_key("six", "six")
    world.add_key("thrifty", "thrifty")
    return world


def post(router: Process, world: World, tenant: str, **body: int) -> httpx.Response:
    return httpx.post(
        f"{router.base_url}/v1/chat/completions", json=chat(**body),
        headers={"Authorization": f"Bearer {world.secrets[tenant]}"}, timeout=30,
    )  # fmt: skip


def ratelimits(answer: httpx.Response) -> dict[str, str]:
    prefix = "x-ratelimit-"
    return {k[len(prefix) :]: v for k, v in answer.headers.items() if k.startswith(prefix)}


def test_tokens_per_minute_debit_prompt_plus_max_tokens(
    engine: Process, private_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    url = private_redis.url
    world = world_for(engine)
    publisher = Publisher(f"switchyard:test:gw-limits:{uuid.uuid4().hex[:8]}", url)
    router = start_router(publisher.prefix, tmp_path, REDIS_URL=url)
    try:
        wait_ready(router, publisher.publish(world.snapshot()))
        # 60 + the router's prompt estimate (22) debited; settled with the actual usage (the
        # simulator's prompt of 8 + all 60): 32 tokens are left.
        served = post(router, world, "thrifty", max_tokens=60)
        assert served.status_code == 200
        # OpenAI's rate-limit headers, from the admission script's own answer: 82 of the 100
        # tokens debited, refilling at 100 per minute (49.2 s); 1 of 1000 requests.
        assert ratelimits(served) == {
            "limit-requests": "1000", "remaining-requests": "999", "reset-requests": "1m0s",
            "limit-tokens": "100", "remaining-tokens": "18", "reset-tokens": "49.2s",
        }  # fmt: skip
        refused = post(router, world, "thrifty", max_tokens=95)  # needs the whole bucket
        assert refused.status_code == 429
        seen = ratelimits(refused)  # the refusal carries them too (nothing more debited)
        assert (seen["limit-tokens"], seen["remaining-requests"]) == ("100", "999")
        assert 32 <= int(seen["remaining-tokens"]) < 40
        error = refused.json()["error"]
        assert error["code"] == "tokens_per_minute_exceeded"
        assert error["type"] == "rate_limit_error"
        assert "100 tokens per minute" in error["message"]
        # The 68 missing tokens refill at 100 per minute: about 41 s.
        assert 38 <= int(refused.headers["retry-after"]) <= 42
        # 22 + 8 <= 32 once settled (settlement lands just after the response).
        eventually(
            lambda: post(router, world, "thrifty", max_tokens=8).status_code == 200,
            timeout=3, interval=0.05, what="a request that fits the settled bucket",
        )  # fmt: skip
    finally:
        router.stop()
        publisher.cleanup()


def test_n_choices_debit_n_times_max_tokens(
    engine: Process, private_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    url = private_redis.url
    world = world_for(engine)
    publisher = Publisher(f"switchyard:test:gw-limits:{uuid.uuid4().hex[:8]}", url)
    router = start_router(publisher.prefix, tmp_path, REDIS_URL=url)
    headers = {"Authorization": f"Bearer {world.secrets['thrifty']}"}

    def two_choices_available() -> int | None:
        """Ask for n=2 x 8 (22 + 16 = 38 tokens); the refusal says what is available."""
        resp = httpx.post(
            f"{router.base_url}/v1/chat/completions",
            json={**chat(max_tokens=8), "n": 2}, headers=headers, timeout=30,
        )  # fmt: skip
        assert resp.status_code == 429, resp.text
        assert resp.json()["error"]["code"] == "tokens_per_minute_exceeded"
        found = re.search(r"\((\d+) available now\)", resp.json()["error"]["message"])
        assert found is not None
        available = int(found.group(1))
        return available if available >= 30 else None  # settled: one choice would fit

    try:
        wait_ready(router, publisher.publish(world.snapshot()))
        assert post(router, world, "thrifty", max_tokens=60).status_code == 200  # 32 left
        available = eventually(two_choices_available, timeout=2.5, what="settlement")
        assert available < 38  # refused for n x max_tokens, not for max_tokens
        assert post(router, world, "thrifty", max_tokens=8).status_code == 200  # 22 + 8 fits
    finally:
        router.stop()
        publisher.cleanup()


def test_redis_down_the_router_keeps_serving_with_local_limits(
    engine: Process, private_redis: EmbeddedRedis, tmp_path: Path
) -> None:
    url = private_redis.url
    world = world_for(engine)
    publisher = Publisher(f"switchyard:test:gw-limits:{uuid.uuid4().hex[:8]}", url)
    router = start_router(publisher.prefix, tmp_path, REDIS_URL=url,
                          SWITCHYARD_ASSUMED_REPLICAS="2")  # fmt: skip
    try:
        wait_ready(router, publisher.publish(world.snapshot()))
        for _ in range(4):
            assert post(router, world, "six").status_code == 200  # global limit: 6
        publisher.client.close()
        private_redis.kill()
        # Local caps: 6 / 2 assumed replicas = 3 more per minute in this router.
        answers = [post(router, world, "six").status_code for _ in range(4)]
        assert answers == [200, 200, 200, 429]
        log = router.output()
        assert log.count("limits: Redis unreachable") == 1
        assert "/ 2 assumed replicas" in log
    finally:
        router.stop()


@pytest.mark.unit
def test_limits_and_fairness_keys_live_in_the_deployments_namespace() -> None:
    assert RouterConfig().limits_keys == "switchyard:limits"
    assert RouterConfig().fairness_keys == "switchyard:fairness"
    bench = RouterConfig(snapshot_prefix="bench:run-1:snapshot")
    assert (bench.limits_keys, bench.fairness_keys) == (
        "bench:run-1:limits",
        "bench:run-1:fairness",
    )
    env = {"SWITCHYARD_LIMITS_PREFIX": "l", "SWITCHYARD_FAIRNESS_PREFIX": "f",
           "SWITCHYARD_ASSUMED_REPLICAS": "3", "SWITCHYARD_QUEUE_LIMIT": "7"}  # fmt: skip
    config = RouterConfig.from_env(env)
    assert (config.limits_keys, config.fairness_keys) == ("l", "f")
    assert (config.assumed_replicas, config.default_queue_limit) == (3, 7)
    assert config.health_interval_s <= 0.25  # the engines' gauges are at most this old
    with pytest.raises(ConfigError, match="SWITCHYARD_ASSUMED_REPLICAS"):
        RouterConfig.from_env({"SWITCHYARD_ASSUMED_REPLICAS": "0"})
    with pytest.raises(ConfigError, match="default_band"):
        RouterConfig(default_band=-1)
