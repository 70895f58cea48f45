"""The result cache through a real router process and simulator engines (issue #12).

Upstream requests are counted at the simulators' ``/metrics`` (``vllm:request_success``),
billing in the router's usage stream in Redis.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import openai
import pytest
import redis
from fixtures.router import (
    Process,
    Publisher,
    World,
    http_get,
    redis_url,
    start_router,
    start_simulator,
    wait_ready,
)
from fixtures.wait import eventually

from runtime.cache.purge import cache_purge
from runtime.metering.events import decode_event

pytestmark = pytest.mark.integration

MODEL = "cache-chat"
SLOW = "cache-slow"


def upstream_count(sim: Process) -> int:
    status, body = http_get(f"{sim.base_url}/metrics")
    assert status == 200
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("vllm:request_success_total"):
            total += float(line.rsplit(" ", 1)[1])
    return int(total)


@dataclass
class CacheFleet:
    router: Process
    sim: Process
    slow: Process
    world: World
    publisher: Publisher

    @property
    def url(self) -> str:
        return self.router.base_url

    def client(self, key: str = "a", **kwargs: object) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.url}/v1", api_key=self.world.secrets[key], max_retries=0, **kwargs
        )  # type: ignore[arg-type]

    def headers(self, key: str = "a", **extra: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.world.secrets[key]}", **extra}

    def usage_events(self, request_ids: set[str]) -> list[object]:
        client = self.publisher.client
        events = [
            decode_event(f[b"event"]) for _, f in client.xrange(f"{self.publisher.prefix}:usage")
        ]
        return [e for e in events if e.request_id in request_ids]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CacheFleet]:
    sim = start_simulator(MODEL, "--decode-a-ms", "1")
    slow = start_simulator(SLOW, "--prefill-tps", "40")
    publisher = Publisher(f"switchyard:test:cache:{uuid.uuid4().hex[:12]}")
    router = None
    try:
        world = World()
        world.add_class("interactive", band=0, deadline_ms=30_000)
        world.add_tenant("acme", classes=("interactive",), default_class="interactive")
        world.add_tenant("beta", classes=("interactive",), default_class="interactive")
        world.add_tenant(
            "optout", classes=("interactive",), default_class="interactive", result_cache=False
        )
        world.add_key("a", "acme")
        world.add_key("b", "beta")
        world.add_key("o", "optout")
        world.add_model(MODEL, 1, digest="sha256:" + "1" * 64)
        world.add_model(SLOW, 3)
        world.add_endpoint(1, 1, sim.base_url)
        world.add_endpoint(3, 3, slow.base_url)
        version = publisher.publish(world.snapshot())
        var_dir: Path = tmp_path_factory.mktemp("cache-router")
        router = start_router(publisher.prefix, var_dir)
        wait_ready(router, version)
        yield CacheFleet(router=router, sim=sim, slow=slow, world=world, publisher=publisher)
    finally:
        if router is not None:
            router.stop()
        sim.stop()
        slow.stop()
        publisher.cleanup()


def prompt() -> list[dict[str, str]]:
    return [{"role": "user", "content": f"tell me about {uuid.uuid4().hex[:10]}"}]


def served_tokens(fleet: CacheFleet, tenant: str) -> float:
    """The router's served-token count (input + output) of ``tenant`` (fairness accounting)."""
    _, body = http_get(f"{fleet.url}/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        if line.startswith("switchyard_served_tokens_total{") and f'tenant="{tenant}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_unary_hit_is_identical_and_reaches_no_engine(fleet: CacheFleet) -> None:
    client, messages = fleet.client(), prompt()
    before = upstream_count(fleet.sim)
    first = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=12
    )  # type: ignore[arg-type]
    served = served_tokens(fleet, "acme")
    second = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=12
    )  # type: ignore[arg-type]
    assert first.headers["x-switchyard-cache"] == "miss"
    assert second.headers["x-switchyard-cache"] == "hit"
    assert first.parse().model_dump() == second.parse().model_dump()
    assert upstream_count(fleet.sim) == before + 1
    usage = second.parse().usage
    assert usage is not None
    # a hit is charged to the fairness counters (at full weight: this version is free)
    assert served_tokens(fleet, "acme") == served + usage.prompt_tokens + usage.completion_tokens
    # a hit is billed (at the cache-hit price) and flagged cached
    ids = {first.headers["x-request-id"], second.headers["x-request-id"]}
    eventually(lambda: len(fleet.usage_events(ids)) == 2, timeout=10, what="two usage events")
    flags = sorted(e.cached for e in fleet.usage_events(ids))  # type: ignore[attr-defined]
    assert flags == [False, True]


def test_streaming_hit_replays_the_same_text_and_usage(fleet: CacheFleet) -> None:
    client, messages = fleet.client(), prompt()
    before = upstream_count(fleet.sim)

    def run() -> tuple[str, str, str | None, object]:
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL,
            messages=messages,
            temperature=0,
            max_tokens=16,
            stream=True,  # type: ignore[arg-type]
            stream_options={"include_usage": True},
        )
        text, finish, usage = "", None, None
        for chunk in raw.parse():
            if chunk.usage is not None:
                usage = chunk.usage.model_dump()
            for choice in chunk.choices:
                text += choice.delta.content or ""
                finish = choice.finish_reason or finish
        return raw.headers["x-switchyard-cache"], text, finish, usage

    miss, hit = run(), run()
    assert miss[0] == "miss"
    assert hit[0] == "hit"
    assert miss[1:] == hit[1:]
    assert miss[1]
    assert upstream_count(fleet.sim) == before + 1
    # the stream's entry answers a unary request too (stream is not part of the key)
    unary = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=messages, temperature=0, max_tokens=16
    )  # type: ignore[arg-type]
    assert unary.headers["x-switchyard-cache"] == "hit"
    assert unary.parse().choices[0].message.content == miss[1]
    assert upstream_count(fleet.sim) == before + 1


def test_completions_route_is_cached(fleet: CacheFleet) -> None:
    client, text = fleet.client(), f"once upon {uuid.uuid4().hex[:8]}"
    before = upstream_count(fleet.sim)
    one = client.completions.create(model=MODEL, prompt=text, temperature=0, max_tokens=8)
    two = client.completions.create(model=MODEL, prompt=text, temperature=0, max_tokens=8)
    assert one.choices[0].text == two.choices[0].text
    assert upstream_count(fleet.sim) == before + 1


@pytest.mark.parametrize(
    ("extra", "headers"),
    [({"temperature": 0.8}, {}), ({}, {}), ({"temperature": 0}, {"Cache-Control": "no-store"})],
    ids=["temperature-0.8", "default-temperature", "no-store"],
)
def test_non_cacheable_requests_always_reach_the_engine(
    fleet: CacheFleet, extra: dict[str, object], headers: dict[str, str]
) -> None:
    body = {"model": MODEL, "messages": prompt(), "max_tokens": 4, **extra}
    before = upstream_count(fleet.sim)
    for _ in range(2):
        response = httpx.post(
            f"{fleet.url}/v1/chat/completions",
            json=body,
            headers=fleet.headers(**headers),
            timeout=10,
        )
        assert response.status_code == 200
        assert response.headers.get("x-switchyard-cache") != "hit"
    assert upstream_count(fleet.sim) == before + 2


def test_tenants_never_share_entries_and_opt_out_works(fleet: CacheFleet) -> None:
    body = {"model": MODEL, "messages": prompt(), "max_tokens": 4, "temperature": 0}
    before = upstream_count(fleet.sim)
    for key in ("a", "b", "o", "o"):
        response = httpx.post(
            f"{fleet.url}/v1/chat/completions", json=body, headers=fleet.headers(key), timeout=10
        )
        assert response.status_code == 200
        assert response.headers.get("x-switchyard-cache") != "hit", key
    assert upstream_count(fleet.sim) == before + 4
    again = httpx.post(
        f"{fleet.url}/v1/chat/completions", json=body, headers=fleet.headers("b"), timeout=10
    )
    assert again.headers["x-switchyard-cache"] == "hit"


def test_fifty_concurrent_identical_requests_make_one_upstream_request(fleet: CacheFleet) -> None:
    body = {"model": MODEL, "messages": prompt(), "max_tokens": 24, "temperature": 0}
    before = upstream_count(fleet.sim)

    async def burst() -> list[httpx.Response]:
        limits = httpx.Limits(max_connections=60)
        async with httpx.AsyncClient(timeout=30, limits=limits) as client:
            return await asyncio.gather(
                *(
                    client.post(
                        f"{fleet.url}/v1/chat/completions",
                        json={**body, "stream": i % 2 == 0},
                        headers=fleet.headers(),
                    )
                    for i in range(50)
                )
            )

    responses = asyncio.run(burst())
    assert {r.status_code for r in responses} == {200}
    assert upstream_count(fleet.sim) == before + 1
    texts = {
        r.json()["choices"][0]["message"]["content"]
        for r in responses
        if r.headers["content-type"].startswith("application/json")
    }
    assert len(texts) == 1


def test_a_new_model_version_misses(fleet: CacheFleet) -> None:
    body = {"model": MODEL, "messages": prompt(), "max_tokens": 4, "temperature": 0}
    url, headers = f"{fleet.url}/v1/chat/completions", fleet.headers()
    assert httpx.post(url, json=body, headers=headers, timeout=10).status_code == 200
    assert (
        httpx.post(url, json=body, headers=headers, timeout=10).headers["x-switchyard-cache"]
        == "hit"
    )
    fleet.world.add_version(MODEL, 2, digest="sha256:" + "2" * 64)
    fleet.world.add_endpoint(2, 2, fleet.sim.base_url)
    wait_ready(fleet.router, fleet.publisher.publish(fleet.world.snapshot()))
    response = httpx.post(url, json=body, headers=headers, timeout=10)
    assert response.headers["x-switchyard-cache"] == "miss"


def test_idempotency_key_replays_and_refuses_reuse(fleet: CacheFleet) -> None:
    key = f"idem-{uuid.uuid4().hex}"
    body = {"model": MODEL, "messages": prompt(), "max_tokens": 8, "temperature": 0.9}
    url, headers = f"{fleet.url}/v1/chat/completions", fleet.headers(**{"Idempotency-Key": key})
    before = upstream_count(fleet.sim)
    first = httpx.post(url, json=body, headers=headers, timeout=10)
    second = httpx.post(url, json=body, headers=headers, timeout=10)
    assert first.status_code == second.status_code == 200
    assert second.headers["x-switchyard-cache"] == "idempotent-replay"
    assert first.json() == second.json()
    assert upstream_count(fleet.sim) == before + 1
    other = httpx.post(url, json={**body, "max_tokens": 9}, headers=headers, timeout=10)
    assert other.status_code == 400
    assert other.json()["error"]["code"] == "idempotency_key_reused"
    # another tenant's key of the same name is its own
    theirs = httpx.post(
        url,
        json={**body, "max_tokens": 9},
        headers=fleet.headers("b", **{"Idempotency-Key": key}),
        timeout=10,
    )
    assert theirs.status_code == 200
    bad = httpx.post(
        url, json=body, headers=fleet.headers(**{"Idempotency-Key": "x" * 300}), timeout=10
    )
    assert bad.status_code == 400
    assert bad.json()["error"]["code"] == "invalid_header"


def test_idempotent_retry_after_a_client_timeout_gets_the_first_result_billed_once(
    fleet: CacheFleet,
) -> None:
    key = f"idem-{uuid.uuid4().hex}"
    # ~40 prompt tokens at 40 tokens/s: about a second before the first token
    body = {
        "model": SLOW,
        "messages": [{"role": "user", "content": "word " * 30 + key}],
        "max_tokens": 4,
        "temperature": 0.7,
    }
    url, headers = f"{fleet.url}/v1/chat/completions", fleet.headers(**{"Idempotency-Key": key})
    before = upstream_count(fleet.slow)
    with pytest.raises(httpx.TimeoutException):
        httpx.post(url, json=body, headers=headers, timeout=0.2)
    retry = httpx.post(url, json=body, headers=headers, timeout=20)
    assert retry.status_code == 200, retry.text
    assert retry.headers["x-switchyard-cache"] == "idempotent-replay"
    assert upstream_count(fleet.slow) == before + 1
    third = httpx.post(url, json=body, headers=headers, timeout=20)
    assert third.json() == retry.json()
    first_id = retry.json()["id"]
    assert first_id
    client = fleet.publisher.client

    def billed() -> list[object]:
        events = [
            decode_event(f[b"event"]) for _, f in client.xrange(f"{fleet.publisher.prefix}:usage")
        ]
        return [e for e in events if e.tenant == "acme" and e.version == 3]  # type: ignore[attr-defined]

    eventually(lambda: len(billed()) >= 1, timeout=10, what="the first request billed")
    assert len(billed()) == 1


def test_purge_drops_a_tenants_entries(fleet: CacheFleet) -> None:
    body = {"model": MODEL, "messages": prompt(), "max_tokens": 4, "temperature": 0}
    url, headers = f"{fleet.url}/v1/chat/completions", fleet.headers()
    httpx.post(url, json=body, headers=headers, timeout=10)
    assert (
        httpx.post(url, json=body, headers=headers, timeout=10).headers["x-switchyard-cache"]
        == "hit"
    )
    client = redis.Redis.from_url(redis_url())
    try:
        removed = cache_purge(client, namespace=fleet.publisher.prefix, tenant="acme")
    finally:
        client.close()
    assert removed >= 1
    assert (
        httpx.post(url, json=body, headers=headers, timeout=10).headers["x-switchyard-cache"]
        == "miss"
    )


@pytest.mark.timing
def test_router_side_latency_of_a_hit(fleet: CacheFleet) -> None:
    """Router-side e2e (request received -> response finished, from the router's request log)
    of unary L1 hits; printed for the README, bounded loosely (shared CI box)."""
    body = {"model": MODEL, "messages": prompt(), "max_tokens": 16, "temperature": 0}
    url = f"{fleet.url}/v1/chat/completions"
    ids: set[str] = set()
    with httpx.Client(headers=fleet.headers(), timeout=10) as client:
        assert client.post(url, json=body).status_code == 200
        for _ in range(300):
            response = client.post(url, json=body)
            assert response.headers["x-switchyard-cache"] == "hit"
            ids.add(response.headers["x-request-id"])

    def logged() -> list[float]:
        out = []
        for line in fleet.router.output().splitlines():
            start = line.find("{")
            if start < 0 or '"request_id"' not in line:
                continue
            try:
                record = json.loads(line[start:])
            except ValueError:
                continue
            if record.get("request_id") in ids:
                out.append(float(record["timings_ms"]["e2e"]))
        return out

    eventually(lambda: len(logged()) == len(ids), timeout=10, what="the hits' log lines")
    timings = sorted(logged())
    p50, p99 = timings[len(timings) // 2], timings[int(len(timings) * 0.99)]
    print(f"router-side hit e2e: p50 {p50:.3f} ms, p99 {p99:.3f} ms over {len(timings)}")
    assert p50 < 25.0
