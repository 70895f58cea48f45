"""A real vLLM CPU engine's KV events reach the router's prefix index.

The session's shared engine (tests/fixtures/vllm_engine.py) is started by the worker launcher
with KV events on; a router-side subscriber maps its ``BlockStored`` events onto the router's
blocks of the prompt it was sent. vLLM on CPU caches blocks of 128 tokens; the demo tokenizer
makes about 1.8 characters a token, so the tracker is told so (``chars_per_token=1``, the safe
side: it never claims more than the engine holds).
"""

from __future__ import annotations

import time

import aiohttp
import pytest
from fixtures.wait import async_eventually

from runtime.routing.kv_subscriber import KvEventSubscribers
from runtime.routing.kv_tracker import KvEventTracker
from runtime.routing.prefix import chat_block_hashes

pytestmark = [pytest.mark.e2e, pytest.mark.asyncio]

SYSTEM = "You are the ACME support assistant. Answer briefly and politely. " * 20  # 1,300 chars


async def test_stored_blocks_reach_the_index(vllm_demo_engine):
    tracker = KvEventTracker(chars_per_token=1, stale_s=60.0)
    subscribers = KvEventSubscribers(tracker, heartbeat_s=0.5)
    subscribers.sync({1: vllm_demo_engine.kv_events_url})
    # A unique system prompt, so the shared engine has none of it cached yet.
    unique = [("system", f"{time.time_ns()} {SYSTEM}"), ("user", "Where is my parcel?")]
    try:
        await async_eventually(  # the socket monitor saw the connection
            lambda: tracker.sizes().get(1) is not None, timeout=30, what="subscribed"
        )
        hashes = chat_block_hashes(unique)
        tracker.note_dispatch(1, hashes, time.monotonic())
        body = {
            "model": vllm_demo_engine.model,
            "max_tokens": 1,
            "messages": [{"role": r, "content": c} for r, c in unique],
        }
        async with (
            aiohttp.ClientSession() as session,
            session.post(f"{vllm_demo_engine.openai_base_url}/chat/completions", json=body) as r,
        ):
            assert r.status == 200, await r.text()
        matched = await async_eventually(
            lambda: tracker.match(hashes, time.monotonic(), [1]).get(1), timeout=30,
            what="the engine's BlockStored mapped onto the router's blocks",
        )  # fmt: skip
        # 5 engine blocks (640 tokens) of a ~1,340-character prompt: at least 2 router blocks
        # at one character a token, never more than the prompt has.
        assert 2 <= matched <= len(hashes)
        assert tracker.precise(1, time.monotonic())
        assert subscribers.bad_messages == {}
    finally:
        await subscribers.close()
