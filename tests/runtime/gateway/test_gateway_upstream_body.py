"""What the router sends upstream, seen by a recording stand-in for a vLLM server.

The stand-in is a minimal aiohttp server (not one of our components) that records each
request's JSON body and headers and answers in vLLM's framing.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
from aiohttp import web
from aiohttp.test_utils import TestServer
from gateway_fleet import Publisher, World, inprocess_router, redis_url

from runtime.gateway.config import RouterConfig

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

Seen = list[tuple[dict[str, Any], dict[str, str]]]


def compact(document: dict[str, Any]) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode()  # as vLLM (pydantic) writes


def recording_app(seen: Seen) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        seen.append((body, {k.lower(): v for k, v in request.headers.items()}))
        chunk = {"id": "c", "object": "chat.completion.chunk", "created": 1, "model": body["model"]}
        if body.get("stream"):
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            delta = {**chunk, "choices": [{"index": 0, "delta": {"content": "hi"}}]}
            await response.write(b"data: " + compact(delta) + b"\n\n")
            final = {**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
            await response.write(b"data: " + compact(final) + b"\n\n")
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            last = {**chunk, "choices": [], "usage": usage, "system_fingerprint": "fp_1"}
            await response.write(b"data: " + compact(last) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        return web.json_response(
            {"id": "c", "object": "chat.completion", "choices": [], "usage": {"prompt_tokens": 1}}
        )

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", ok)
    app.router.add_get("/metrics", ok)
    return app


@pytest_asyncio.fixture
async def setup(tmp_path: Path) -> AsyncIterator[tuple[str, World, Seen, Publisher]]:
    seen: Seen = []
    upstream = TestServer(recording_app(seen), host="127.0.0.1")
    await upstream.start_server()
    world = World()
    world.add_class("interactive", band=0)
    world.add_class("batch", band=2)
    world.add_tenant("acme", classes=("interactive", "batch"), default_class="interactive")
    world.add_key("good", "acme")
    world.add_model("m", 1)
    world.versions[1] = msgspec.structs.replace(
        world.versions[1], default_sampling={"temperature": 0.25, "top_k": 5}
    )
    world.add_endpoint(1, 1, f"http://127.0.0.1:{upstream.port}", pool="plain")
    world.add_model("prio", 2)
    world.add_endpoint(2, 2, f"http://127.0.0.1:{upstream.port}", pool="prio-pool")
    world.pools["prio-pool"] = msgspec.structs.replace(
        world.pools["prio-pool"], policies={"upstream_priority": "on"}
    )
    publisher = Publisher(f"switchyard:test:gw-body:{uuid.uuid4().hex[:8]}")
    publisher.publish(world.snapshot())
    config = RouterConfig(
        redis_url=redis_url(),
        snapshot_prefix=publisher.prefix,
        snapshot_cache_path=tmp_path / "router-snapshot.json",
        key_usage_hash=f"{publisher.prefix}:apikey:last_used",
    )
    try:
        async with inprocess_router(config) as base_url:
            yield base_url, world, seen, publisher
    finally:
        publisher.cleanup()
        await upstream.close()


async def test_upstream_body_is_normalised(setup: tuple[str, World, Seen, Publisher]) -> None:
    base_url, world, seen, _ = setup
    headers = {"Authorization": f"Bearer {world.secrets['good']}", "X-Request-Id": "rid-1"}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10) as http:
        unary = await http.post(
            "/v1/chat/completions",
            json={"model": "m", "messages": [{"role": "user", "content": "x"}], "priority": -9},
        )
        assert unary.status_code == 200
        stream = await http.post(
            "/v1/chat/completions",
            json={
                "model": "m",
                "messages": [{"role": "user", "content": "x"}],
                "stream": True,
                "temperature": 1.5,
                "max_completion_tokens": 7,
            },
        )
        assert stream.status_code == 200
        rich = await http.post("/v1/chat/completions", json=RICH)
        assert rich.status_code == 200
    (first, first_headers), (second, _), (third, _) = seen
    assert first == {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 512,  # the tenant's cap when the client gives none
        "temperature": 0.25,  # the version's default; top_k is not a default we set
    }
    assert first_headers["x-request-id"] == "rid-1"
    assert second["stream_options"] == {"include_usage": True}  # always, to meter
    assert second["temperature"] == 1.5
    assert second["max_tokens"] == 7
    assert "max_completion_tokens" not in second
    assert "priority" not in first
    assert "priority" not in second
    # The client did not ask for usage: the usage-only chunk is not relayed, and its
    # fingerprint goes on the final chunk, where vLLM puts it for such a client.
    assert '"usage"' not in stream.text
    assert stream.text.endswith("data: [DONE]\n\n")
    events = [json.loads(line[6:]) for line in stream.text.splitlines() if line[6:7] == "{"]
    assert [e.get("system_fingerprint") for e in events] == [None, "fp_1"]
    assert events[-1]["choices"][0]["finish_reason"] == "stop"
    # Everything the router does not read goes upstream verbatim; it sets only max_tokens
    # (n x 6 counted against the caps) and include_usage (keeping the client's other options).
    expected = {**RICH, "max_tokens": 6}
    expected["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    del expected["priority"]
    assert third == expected


RICH: dict[str, Any] = {
    "model": "m",
    "messages": [
        {"role": "developer", "content": "be brief", "name": "ops"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "data:image/png;base64,AA", "detail": "low"},
                },
            ],
        },
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "42"},
    ],
    "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}],
    "tool_choice": {"type": "function", "function": {"name": "f"}},
    "parallel_tool_calls": False,
    "response_format": {"type": "json_object"},
    "logprobs": True,
    "top_logprobs": 3,
    "logit_bias": {"50256": -100},
    "metadata": {"team": "x"},
    "store": False,
    "reasoning_effort": "low",
    "top_k": 5,
    "min_p": 0.1,
    "repetition_penalty": 1.1,
    "ignore_eos": True,
    "guided_json": {"type": "object"},
    "n": 2,
    "seed": 7,
    "stop": ["\n\n"],
    "temperature": 0.0,
    "max_tokens": 6,
    "user": "u-1",
    "priority": -5,
    "stream": True,
    "stream_options": {"continuous_usage_stats": True},
}


async def test_priority_band_goes_upstream_only_where_the_pool_says_so(
    setup: tuple[str, World, Seen, Publisher],
) -> None:
    base_url, world, seen, _ = setup
    headers = {"Authorization": f"Bearer {world.secrets['good']}"}
    body = {"model": "prio", "messages": [{"role": "user", "content": "x"}], "priority": 0}
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=10) as http:
        default = await http.post("/v1/chat/completions", json=body)
        batch = await http.post(
            "/v1/chat/completions", json=body, headers={"X-Switchyard-Class": "batch"}
        )
    assert (default.status_code, batch.status_code) == (200, 200)
    assert [b["priority"] for b, _ in seen] == [0, 2]
