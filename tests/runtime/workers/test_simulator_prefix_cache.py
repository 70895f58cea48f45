"""The simulator's prefix cache: stand-in tokens, chained block hashes, LRU, TTFT and metrics."""

from __future__ import annotations

import time

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from runtime.workers.simulator.__main__ import build_parser, config_from_args
from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.prefix_cache import (
    PrefixCache,
    PrefixCacheConfig,
    render_chat,
    render_text,
    text_block_hashes,
    token_block_hashes,
)
from runtime.workers.simulator.server import create_app
from runtime.workers.simulator.text import count_chat_tokens, count_text_tokens
from runtime.workers.simulator.timing import Capacity, TimingModel

pytestmark = pytest.mark.unit

MODEL = "sim-prefix"
SYSTEM = "You are a careful assistant for the ACME support desk. " * 40  # ~560 tokens


def test_rendering_keeps_the_stand_in_token_counts():
    for text in ("", "a", "abcd", "abcde", "x" * 4001):
        assert len(render_text(text)) == 4 * count_text_tokens(text)
    contents = ["", "abcdefgh", "abc", SYSTEM]
    messages = [("user", c) for c in contents]
    assert len(render_chat(messages)) == 4 * count_chat_tokens(contents)


def test_block_hashes_chain_over_full_blocks_only():
    a = text_block_hashes(render_text("x" * 64 * 3 + "tail"), block_size=16)
    b = text_block_hashes(render_text("x" * 64 * 3 + "other tail longer"), block_size=16)
    assert len(a) == 3  # the partial block is not hashed
    assert a == b[:3]
    # Same block content at another position: a different hash (it covers its parent).
    assert len(set(a)) == 3
    assert token_block_hashes(list(range(40)), 16)[:2] == token_block_hashes(list(range(35)), 16)
    assert len(token_block_hashes(list(range(15)), 16)) == 0


def test_a_shared_system_prompt_and_a_growing_history_share_blocks():
    turn1 = [("system", SYSTEM), ("user", "What is my balance?")]
    turn2 = [*turn1, ("assistant", "It is 12 credits." * 8), ("user", "Thanks, and the fees?")]
    other = [("system", SYSTEM), ("user", "Something else entirely")]
    h1, h2, h3 = (text_block_hashes(render_chat(m), 16) for m in (turn1, turn2, other))
    assert h2[: len(h1)] == h1  # the whole first turn (full blocks) is a prefix of the second
    shared = sum(1 for x, y in zip(h1, h3, strict=False) if x == y)
    assert shared >= len(SYSTEM) // 64 - 1  # the system prompt's blocks


def test_hits_are_the_leading_cached_blocks_and_never_the_whole_prompt():
    cache = PrefixCache(PrefixCacheConfig(block_size=4, capacity_blocks=100))
    assert cache.admit([1, 2, 3], prompt_tokens=14) == 0
    assert cache.admit([1, 2, 3], prompt_tokens=14) == 12
    assert cache.admit([1, 9, 3], prompt_tokens=14) == 4  # a miss ends the run
    assert cache.admit([1, 2, 3], prompt_tokens=12) == 11  # the last token is recomputed


def test_capacity_evicts_the_least_recently_used_blocks_tail_first():
    cache = PrefixCache(PrefixCacheConfig(block_size=4, capacity_blocks=4))
    cache.admit([1, 2], prompt_tokens=10)
    cache.admit([5, 6], prompt_tokens=10)
    cache.admit([1, 2], prompt_tokens=10)  # chain 1-2 becomes the most recent
    cache.admit([7, 8], prompt_tokens=10)  # evicts chain 5-6, its tail first
    assert [h for h in (1, 2, 5, 6, 7, 8) if h in cache] == [1, 2, 7, 8]
    assert cache.evictions == 2
    cache.admit([9], prompt_tokens=10)  # one more: the LRU tail (2) goes, its root stays
    assert [h for h in (1, 2) if h in cache] == [1]
    assert cache.hit_tokens([1, 2], prompt_tokens=10) == 4


def test_capacity_zero_turns_caching_off():
    cache = PrefixCache(PrefixCacheConfig(block_size=4, capacity_blocks=0))
    cache.admit([1, 2], prompt_tokens=10)
    assert cache.admit([1, 2], prompt_tokens=10) == 0
    assert len(cache) == 0


def test_cli_sizes_the_cache_from_the_kv_capacity_by_default():
    parse = build_parser().parse_args
    config = config_from_args(parse(["--model", "m", "--kv-capacity-tokens", "8192"]))
    assert config.prefix_cache == PrefixCacheConfig(block_size=16, capacity_blocks=512)
    args = parse(["--model", "m", "--block-size", "32", "--prefix-cache-blocks", "0"])
    assert config_from_args(args).prefix_cache == PrefixCacheConfig(32, 0)
    with pytest.raises(ValueError, match="block_size"):
        config_from_args(parse(["--model", "m", "--block-size", "0"]))


# -- through the HTTP API ----------------------------------------------------------------------
PREFILL_TPS = 20_000.0  # a ~600-token prompt costs ~30 ms of prefill


@pytest_asyncio.fixture
async def served():
    servers: list[TestServer] = []

    async def _serve(capacity_blocks: int = 1024) -> str:
        config = SimulatorConfig(
            model=MODEL,
            timing=TimingModel(prefill_tps=PREFILL_TPS, decode_a_ms=1, decode_b_ms=0),
            capacity=Capacity(max_num_seqs=8, kv_capacity_tokens=16384),
            max_model_len=4096,
            prefix_cache=PrefixCacheConfig(block_size=16, capacity_blocks=capacity_blocks),
        )
        server = TestServer(create_app(config), host="127.0.0.1")
        await server.start_server()
        servers.append(server)
        return f"http://127.0.0.1:{server.port}"

    yield _serve
    for server in servers:
        await server.close()


async def _ttft(session: aiohttp.ClientSession, url: str, user: str) -> float:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": user}],
        "max_tokens": 2,
        "stream": True,
    }
    start = time.perf_counter()
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        assert resp.status == 200
        async for _ in resp.content:  # the first SSE line carries the first token
            ttft = time.perf_counter() - start
            break
        await resp.read()
    return ttft


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing")


@pytest.mark.asyncio
async def test_a_repeated_system_prompt_hits_the_cache_and_answers_faster(served):
    url = await served()
    prompt_tokens = count_chat_tokens([SYSTEM, "first question"])
    async with aiohttp.ClientSession() as session:
        cold = await _ttft(session, url, "first question")
        warm = [await _ttft(session, url, f"question {i}") for i in range(3)]
        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
    queries = _counter(text, "vllm:prefix_cache_queries_total")
    hits = _counter(text, "vllm:prefix_cache_hits_total")
    users = ["first question"] + [f"question {i}" for i in range(3)]
    assert queries == sum(count_chat_tokens([SYSTEM, user]) for user in users)
    # Every warm request finds the system prompt's full blocks (all but its last partial one).
    per_warm = hits / 3
    assert per_warm >= (len(render_text(SYSTEM)) // 64 - 1) * 16
    cold_prefill = prompt_tokens / PREFILL_TPS
    assert cold >= cold_prefill
    assert min(warm) < cold - cold_prefill / 2, (cold, warm)


@pytest.mark.asyncio
async def test_reset_prefix_cache_starts_cold_again(served):
    url = await served()
    async with aiohttp.ClientSession() as session:
        await _ttft(session, url, "one")
        await _ttft(session, url, "two")
        async with session.post(f"{url}/reset_prefix_cache") as resp:
            assert resp.status == 200
            assert await resp.json() == {"success": True}
        await _ttft(session, url, "three")
        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
    hits = _counter(text, "vllm:prefix_cache_hits_total")
    one_hit = (len(render_text(SYSTEM)) // 64) * 16  # the system prompt's full blocks, at least
    assert one_hit <= hits < 2 * one_hit  # "two" hit, "three" (after the reset) did not


@pytest.mark.asyncio
async def test_without_a_cache_nothing_hits(served):
    url = await served(capacity_blocks=0)
    async with aiohttp.ClientSession() as session:
        for i in range(2):
            await _ttft(session, url, f"question {i}")
        async with session.get(f"{url}/metrics") as resp:
            text = await resp.text()
    assert _counter(text, "vllm:prefix_cache_hits_total") == 0
    assert _counter(text, "vllm:prefix_cache_queries_total") > 0
