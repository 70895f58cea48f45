"""runtime/cache pieces on their own: cacheability, keys, entries and their SSE replay, the L2
quota (real Redis) and single flight across two routers' flight tables (real Redis)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
import pytest_asyncio
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from runtime.cache.entry import (
    CachedUsage,
    Entry,
    from_stream,
    from_unary,
    parse_sse,
    sse_frames,
    unary_body,
)
from runtime.cache.flight import Flights, Lead
from runtime.cache.metrics import CacheMetrics
from runtime.cache.policy import cache_key, cacheable, no_store
from runtime.cache.sealing import Sealer
from runtime.cache.store import ResultStore, StoreConfig
from runtime.contract import cache_entry_key, cache_lease_key
from runtime.crypto import Keyring, generate_key
from runtime.snapshot import CachePolicySnap, ModelSnap, TenantSnap
from runtime.testing.snapshots import limits, version_snap

pytestmark = pytest.mark.unit

MODEL = ModelSnap(name="m", task="chat", versions=(1,))
VLLM = version_snap(1, "m", runtime="vllm", digest="sha256:aa")
SIM = version_snap(1, "m", runtime="simulator", digest="sha256:aa")
TENANT = TenantSnap(slug="acme", name="Acme", limits=limits())
CHAT = "/v1/chat/completions"


def doc(**fields: Any) -> dict[str, Any]:
    return {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}


@pytest.mark.unit
@pytest.mark.parametrize(
    ("fields", "version", "ok"),
    [
        ({"temperature": 0}, VLLM, True),
        ({"temperature": 0.0, "n": 1}, VLLM, True),
        ({"temperature": 0.8}, VLLM, False),
        ({}, VLLM, False),  # the default temperature is 1
        ({"temperature": 0.8, "seed": 7}, VLLM, False),  # vLLM: a seed is not enough
        ({"temperature": 0.8, "seed": 7}, SIM, True),  # a deterministic runtime
        ({"temperature": 0, "n": 2}, VLLM, False),
        ({"temperature": 0, "tools": [{"type": "function"}]}, VLLM, False),
        ({"temperature": 0, "logprobs": True}, VLLM, False),
    ],
)
def test_cacheable(fields: dict[str, Any], version: Any, ok: bool) -> None:
    assert cacheable(doc(**fields), route=CHAT, model=MODEL, version=version, tenant=TENANT) is ok


@pytest.mark.unit
def test_operator_switches_and_routes() -> None:
    off = msgspec.structs.replace(MODEL, cache=CachePolicySnap(enabled=False))
    opted_out = msgspec.structs.replace(TENANT, result_cache=False)
    zero = doc(temperature=0)
    assert not cacheable(zero, route=CHAT, model=off, version=VLLM, tenant=TENANT)
    assert not cacheable(zero, route=CHAT, model=MODEL, version=VLLM, tenant=opted_out)
    assert not cacheable(zero, route="/v1/embeddings", model=MODEL, version=VLLM, tenant=TENANT)
    default_zero = version_snap(1, "m", runtime="vllm", default_sampling={"temperature": 0.0})
    assert cacheable(doc(), route=CHAT, model=MODEL, version=default_zero, tenant=TENANT)
    assert no_store(b"no-store")
    assert no_store(b"max-age=0, No-Store")
    assert not no_store(None)
    assert not no_store(b"max-age=60")


@pytest.mark.unit
def test_key_ignores_stream_and_user_but_not_scope_version_or_content() -> None:
    base = cache_key(doc(temperature=0), route=CHAT, scope="acme", version=VLLM)
    same = doc(temperature=0, stream=True, stream_options={"include_usage": True}, user="u")
    assert cache_key(same, route=CHAT, scope="acme", version=VLLM) == base
    reordered = dict(reversed(list(doc(temperature=0).items())))
    assert cache_key(reordered, route=CHAT, scope="acme", version=VLLM) == base
    other_version = version_snap(2, "m", runtime="vllm", digest="sha256:bb")
    assert cache_key(doc(temperature=0), route=CHAT, scope="beta", version=VLLM) != base
    assert cache_key(doc(temperature=0), route=CHAT, scope="acme", version=other_version) != base
    assert cache_key(doc(temperature=0, max_tokens=3), route=CHAT, scope="acme",
                     version=VLLM) != base  # fmt: skip


def _chunk(**fields: Any) -> bytes:
    return msgspec.json.encode({"id": "c1", "created": 5, "model": "m", **fields})


def test_stream_capture_round_trips_to_sse_and_json() -> None:
    payloads = [
        _chunk(choices=[{"index": 0, "delta": {"role": "assistant", "content": ""}}]),
        _chunk(choices=[{"index": 0, "delta": {"content": "Hel"}}]),
        _chunk(choices=[{"index": 0, "delta": {"content": "lo"}, "finish_reason": None}]),
        _chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "stop"}]),
        _chunk(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5}),
    ]
    entry = from_stream("chat", payloads, None)
    assert entry is not None
    assert entry.chunks == ("Hel", "lo")
    assert entry.usage == CachedUsage(3, 2, 5)
    frames = sse_frames(entry, include_usage=True)
    assert frames[-1] == b"data: [DONE]\n\n"
    replay = [msgspec.json.decode(p) for p in parse_sse(b"".join(frames))]
    assert replay[0]["choices"][0]["delta"]["role"] == "assistant"
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in replay[:-1]) == "Hello"
    assert replay[-2]["choices"][0]["finish_reason"] == "stop"
    assert replay[-1]["choices"] == []
    assert replay[-1]["usage"]["total_tokens"] == 5
    assert len(parse_sse(b"".join(sse_frames(entry, include_usage=False)))) == 4
    body = msgspec.json.decode(unary_body(entry))
    assert body["choices"][0]["message"]["content"] == "Hello"
    assert body["object"] == "chat.completion"


def test_uncacheable_answers_are_not_entries() -> None:
    usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
    tool = _chunk(choices=[{"index": 0, "delta": {"tool_calls": [{"id": "t"}]}}])
    broken = _chunk(choices=[{"index": 0, "delta": {}, "finish_reason": "error"}], error={})
    unfinished = _chunk(choices=[{"index": 0, "delta": {"content": "x"}}])
    assert from_stream("chat", [tool], CachedUsage(1, 1, 2)) is None
    assert from_stream("chat", [broken], CachedUsage(1, 1, 2)) is None
    assert from_stream("chat", [unfinished], CachedUsage(1, 1, 2)) is None
    two = msgspec.json.encode({"choices": [{"text": "a"}, {"text": "b"}], "usage": usage})
    assert from_unary("completion", two) is None
    one = msgspec.json.encode({"choices": [{"text": "a", "finish_reason": "length"}],
                               "usage": usage})  # fmt: skip
    entry = from_unary("completion", one)
    assert entry is not None
    assert unary_body(entry) == one  # byte for byte


@pytest_asyncio.fixture
async def client() -> AsyncIterator[aioredis.Redis[bytes]]:
    redis = aioredis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"))
    yield redis
    await redis.aclose()  # type: ignore[attr-defined]


def _entry(text: str) -> Entry:
    return Entry(kind="chat", id="x", created=1, model="m", chunks=(text,),
                 finish_reason="stop", usage=CachedUsage(1, 1, 2))  # fmt: skip


@pytest.mark.asyncio
async def test_l2_quota_evicts_only_within_the_tenant(client: aioredis.Redis[bytes]) -> None:
    ns = f"switchyard:test:cache:{uuid.uuid4().hex[:10]}"
    metrics = CacheMetrics(CollectorRegistry())
    config = StoreConfig(l1_bytes=1, max_entry_bytes=1, tenant_quota_bytes=1200)
    sealer = Sealer(Keyring.from_spec(f"k1:{generate_key()}"))
    store = ResultStore(client, namespace=ns, config=config, metrics=metrics, sealer=sealer)
    try:
        await store.put("beta", "v", "b0", _entry("b" * 100), ttl_s=60)
        for i in range(10):
            await store.put("acme", "v", f"a{i}", _entry("a" * 300), ttl_s=60)
        present = [
            await client.exists(cache_entry_key(ns, "acme", "v", f"a{i}")) for i in range(10)
        ]
        assert sum(present) < 10
        assert present[-1] == 1
        assert await client.exists(cache_entry_key(ns, "beta", "v", "b0")) == 1
        assert metrics.evictions.labels("l2")._value.get() >= 1
        hit = await store.get("acme", "v", "a9")
        assert hit is not None
        assert hit.chunks == ("a" * 300,)
    finally:
        keys = [k async for k in client.scan_iter(match=f"{ns}:*")]
        if keys:
            await client.delete(*keys)


@pytest.mark.asyncio
async def test_single_flight_across_routers_and_a_dead_leaders_lease(
    client: aioredis.Redis[bytes],
) -> None:
    ns = f"switchyard:test:flight:{uuid.uuid4().hex[:10]}"
    metrics = CacheMetrics(CollectorRegistry())
    one = Flights(client, namespace=ns, metrics=metrics, lease_s=0.5, poll_s=0.01)
    two = Flights(client, namespace=ns, metrics=metrics, lease_s=0.5, poll_s=0.01)
    stored: list[Entry] = []

    async def lookup() -> Entry | None:
        return stored[0] if stored else None

    loop = asyncio.get_running_loop()
    try:
        lead = await one.join("k", lookup=lookup, deadline=loop.time() + 5)
        assert isinstance(lead, Lead)
        local = asyncio.create_task(one.join("k", lookup=lookup, deadline=loop.time() + 5))
        remote = asyncio.create_task(two.join("k", lookup=lookup, deadline=loop.time() + 5))
        await asyncio.sleep(0.05)
        assert not local.done()
        assert not remote.done()
        stored.append(_entry("answer"))
        await lead.finish(stored[0])
        assert await local == stored[0]
        assert await remote == stored[0]
        assert await client.exists(cache_lease_key(ns, "k")) == 0
        # a leader that dies holding the lease: the follower takes over once it lapses
        stored.clear()
        await client.set(cache_lease_key(ns, "k2"), b"dead", px=300)
        started = loop.time()
        took_over = await two.join("k2", lookup=lookup, deadline=loop.time() + 5)
        assert isinstance(took_over, Lead)
        assert loop.time() - started >= 0.2
        await took_over.finish(None)
        # a follower whose deadline comes first goes upstream alone
        await client.set(cache_lease_key(ns, "k3"), b"slow", px=5000)
        assert await two.join("k3", lookup=lookup, deadline=loop.time() + 0.1) is None
    finally:
        keys = [k async for k in client.scan_iter(match=f"{ns}:*")]
        if keys:
            await client.delete(*keys)


class _StuckSink:
    """A client that reads the headers, then stops reading (the body's send never returns)
    until the task is cancelled; what it is sent after that is kept."""

    def __init__(self) -> None:
        self.stuck: asyncio.Event = asyncio.Event()  # set once the body's send hangs
        self.after_cancel: list[tuple[bytes, bool]] = []

    async def start_response(self, status: int, headers: Any) -> None:
        return

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        if not self.stuck.is_set():
            self.stuck.set()
            await asyncio.Event().wait()
        self.after_cancel.append((data, last))


@pytest.mark.unit
@pytest.mark.asyncio
@pytest.mark.parametrize("reason", ["router_shutdown", None])
async def test_a_stored_stream_cut_by_the_router_ends_with_its_terminal_chunk(
    reason: str | None,
) -> None:
    from runtime.gateway.cache_front import send_entry  # noqa: PLC0415

    entry = Entry(kind="chat", id="chatcmpl-1", created=7, model="m", chunks=("Hi",),
                  finish_reason="stop", usage=CachedUsage(1, 1, 2))  # fmt: skip
    sink = _StuckSink()
    sending = send_entry(
        sink, entry, streaming=True, include_usage=False, headers=(), cut=lambda: reason
    )
    task = asyncio.get_running_loop().create_task(sending)
    await asyncio.wait_for(sink.stuck.wait(), 5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    if reason is None:  # the client went away: nothing more is written
        assert sink.after_cancel == []
        return
    ((data, last),) = sink.after_cancel
    assert last
    assert data.endswith(b"data: [DONE]\n\n")
    (payload,) = parse_sse(data)  # the terminal chunk alone, then [DONE]
    terminal = msgspec.json.decode(payload)
    assert terminal["id"] == "chatcmpl-1"
    assert terminal["choices"][0]["finish_reason"] == "error"
    assert terminal["error"]["code"] == "router_shutdown"
