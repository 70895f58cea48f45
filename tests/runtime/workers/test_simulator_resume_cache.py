"""The simulator caches a sequence's generated blocks (issue #34): chat templates'
``continue_final_message``, and a resumed stream's continuation hitting the prompt's and the
generated text's blocks on the same engine."""

from __future__ import annotations

import json
from collections.abc import Sequence

import aiohttp
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer
from fixtures.wait import async_eventually

from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.engine import Engine
from runtime.workers.simulator.prefix_cache import (
    PrefixCache,
    PrefixCacheConfig,
    render_chat,
    render_text,
    text_block_hashes,
)
from runtime.workers.simulator.protocol import ApiError, parse_chat
from runtime.workers.simulator.server import create_app
from runtime.workers.simulator.text import count_chat_tokens, count_text_tokens
from runtime.workers.simulator.timing import Capacity, TimingModel

pytestmark = pytest.mark.unit

MODEL = "sim-resume"
SYSTEM = "You answer questions for the ACME support desk, briefly. " * 6
QUESTION = "How do I reset my password?"
OPEN = {"add_generation_prompt": False, "continue_final_message": True}
BLOCK = 16  # tokens a block; 64 characters of a rendering


def _messages(*extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [("system", SYSTEM), ("user", QUESTION), *extra]


# -- rendering ---------------------------------------------------------------------------------
def test_a_continuation_renders_as_the_prompt_followed_by_the_text():
    for text in (" lorem ipsum", " lorem ipsum dolor"):  # a multiple of 4 characters, and not
        continued = _messages(("assistant", text))
        rendered = render_chat(continued, **OPEN)
        assert rendered == render_chat(_messages()) + render_text(text)
        contents = [content for _, content in continued]
        assert len(rendered) == 4 * count_chat_tokens(contents, **OPEN)
        closed = render_chat(continued)  # the assistant turn ended, a new one opened
        assert closed.startswith(rendered)
        assert len(closed) == len(rendered) + 4 * (1 + 3)
        assert len(closed) == 4 * count_chat_tokens(contents)
        no_header = render_chat(continued, add_generation_prompt=False)
        assert no_header == closed[: -4 * 3]
        assert len(no_header) == 4 * count_chat_tokens(contents, add_generation_prompt=False)


def _config(capacity_blocks: int = 1024, decode_ms: float = 1) -> SimulatorConfig:
    return SimulatorConfig(
        model=MODEL,
        timing=TimingModel(prefill_tps=1e6, decode_a_ms=decode_ms, decode_b_ms=0),
        capacity=Capacity(max_num_seqs=8, kv_capacity_tokens=16384),
        max_model_len=4096,
        prefix_cache=PrefixCacheConfig(block_size=BLOCK, capacity_blocks=capacity_blocks),
    )


def _chat_body(messages: Sequence[tuple[str, str]], **extra: object) -> dict[str, object]:
    return {"messages": [{"role": r, "content": c} for r, c in messages], **extra}


def test_the_chat_parse_honours_the_template_flags():
    config = _config()
    continued = _messages(("assistant", " so far"))
    gen = parse_chat(_chat_body(continued, **OPEN), config)
    assert gen.prompt_tokens == count_chat_tokens([c for _, c in continued], **OPEN)
    assert gen.rendered == render_chat(continued, **OPEN)
    assert gen.block_hashes == text_block_hashes(gen.rendered, BLOCK)
    # continue_final_message alone: no generation prompt is added to the open message
    alone = parse_chat(_chat_body(continued, continue_final_message=True), config)
    assert alone.rendered == gen.rendered
    plain = parse_chat(_chat_body(_messages()), config)
    assert plain.rendered == render_chat(_messages())


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        ({"continue_final_message": True, "add_generation_prompt": True}, "Cannot set both"),
        ({"continue_final_message": "yes"}, "continue_final_message must be a boolean"),
        ({"add_generation_prompt": 1}, "add_generation_prompt must be a boolean"),
    ],
)
def test_the_chat_parse_refuses_bad_template_flags(flags, message):
    with pytest.raises(ApiError, match=message) as caught:
        parse_chat(_chat_body(_messages(), **flags), _config())
    assert caught.value.status == 400


# -- the engine --------------------------------------------------------------------------------
class Listener:
    """A CacheListener that keeps the stored chains (what the KV-event publisher would send)."""

    def __init__(self) -> None:
        self.calls: list[tuple[int | None, tuple[int, ...]]] = []

    def stored(self, parent: int | None, hashes: Sequence[int], block_size: int) -> None:
        self.calls.append((parent, tuple(hashes)))

    def removed(self, hashes: Sequence[int]) -> None:
        pass

    def cleared(self) -> None:
        pass


@pytest_asyncio.fixture
async def engine():
    listener = Listener()
    cache = PrefixCache(PrefixCacheConfig(block_size=BLOCK, capacity_blocks=1024), listener)
    fast = TimingModel(prefill_tps=1e9, decode_a_ms=1, decode_b_ms=0)
    eng = Engine(timing=fast, capacity=Capacity(max_num_seqs=4), prefix_cache=cache)
    eng.start()
    yield eng, listener
    await eng.stop()


def _submit(eng: Engine, rendered: str, tokens: int, word: str = "abcd", *, prompt: int = 0):
    return eng.submit(
        request_id=f"r-{len(rendered)}-{tokens}",
        prompt_tokens=prompt or len(rendered) // 4,
        max_tokens=tokens,
        output_tokens=tokens,
        finish_reason="length",
        priority=0,
        words=iter([word] * tokens),
        block_hashes=text_block_hashes(rendered, BLOCK),
        rendered=rendered,
    )


async def _drain(seq) -> str:
    parts: list[str] = []
    while (tokens := await seq.next_tokens()) is not None:
        parts.extend(tokens)
    return "".join(parts)


@pytest.mark.asyncio
async def test_a_finished_sequence_caches_its_generated_blocks_and_reports_them(engine):
    eng, listener = engine
    rendered = render_text("p" * 64 * 2)  # two full prompt blocks
    text = await _drain(_submit(eng, rendered, tokens=40))  # 160 characters: 2.5 blocks
    prompt_blocks = text_block_hashes(rendered, BLOCK)
    every = text_block_hashes(rendered + text, BLOCK)
    assert len(every) == 4
    assert every[:2] == prompt_blocks
    assert all(h in eng.prefix_cache for h in every)
    # KV events: the prompt's blocks at admission, the generated ones after them on leaving
    assert listener.calls == [(None, prompt_blocks), (prompt_blocks[-1], every[2:])]


@pytest.mark.asyncio
async def test_an_aborted_sequence_caches_what_it_generated_so_far(engine):
    eng, _ = engine
    eng.timing = TimingModel(prefill_tps=1e9, decode_a_ms=5, decode_b_ms=0)
    rendered = render_text("q" * 64)
    seq = _submit(eng, rendered, tokens=400)
    await async_eventually(lambda: seq.generated >= 40, timeout=10, what="40 tokens")
    eng.abort(seq)
    text = "abcd" * seq.generated
    every = text_block_hashes(rendered + text, BLOCK)
    assert len(every) == 1 + seq.generated // BLOCK >= 3
    assert all(h in eng.prefix_cache for h in every)
    assert text_block_hashes(rendered + text + "abcd" * 16, BLOCK)[-1] not in eng.prefix_cache


@pytest.mark.asyncio
async def test_a_sequence_aborted_while_waiting_caches_nothing(engine):
    eng, listener = engine
    eng.capacity = Capacity(max_num_seqs=1)
    eng.timing = TimingModel(prefill_tps=1e9, decode_a_ms=5, decode_b_ms=0)
    first = _submit(eng, render_text("a" * 64), tokens=200)
    waiting = _submit(eng, render_text("b" * 64), tokens=10)
    await async_eventually(lambda: first.generated >= 1, timeout=10, what="first running")
    eng.abort(waiting)
    eng.abort(first)
    never = text_block_hashes(render_text("b" * 64), BLOCK)[0]
    assert never not in eng.prefix_cache
    assert never not in {h for _, chain in listener.calls for h in chain}


# -- through the HTTP API ----------------------------------------------------------------------
@pytest_asyncio.fixture
async def sim():
    server = TestServer(create_app(_config(decode_ms=2)), host="127.0.0.1")
    await server.start_server()
    async with aiohttp.ClientSession() as session:
        yield session, f"http://127.0.0.1:{server.port}"
    await server.close()


async def _metric(session: aiohttp.ClientSession, url: str, name: str) -> float:
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    for line in text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} missing")


async def _hits_of(session: aiohttp.ClientSession, url: str, path: str, body: dict) -> float:
    """The prefix-cache hits of one request (``max_tokens`` 1, not streamed)."""
    before = await _metric(session, url, "vllm:prefix_cache_hits_total")
    async with session.post(f"{url}{path}", json={**body, "max_tokens": 1}) as resp:
        assert resp.status == 200, await resp.text()
    return await _metric(session, url, "vllm:prefix_cache_hits_total") - before


async def _cut_chat_stream(session: aiohttp.ClientSession, url: str, chars: int) -> str:
    """Stream a long answer, hang up after ``chars`` characters; the text received."""
    body = {**_chat_body(_messages()), "max_tokens": 1000, "stream": True}
    received = ""
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        async for line in resp.content:
            if not line.startswith(b"data: {"):
                continue
            choice = json.loads(line[6:])["choices"][0]
            assert choice["finish_reason"] is None  # cut long before its end
            received += choice["delta"].get("content") or ""
            if len(received) >= chars:
                break
        resp.close()

    async def idle() -> bool:
        return await _metric(session, url, "vllm:num_requests_running") == 0

    await async_eventually(idle, timeout=10, what="the cut stream left the batch")
    return received


@pytest.mark.asyncio
async def test_a_cut_chat_streams_continuation_hits_its_prompt_and_generated_blocks(sim):
    session, url = sim
    received = await _cut_chat_stream(session, url, chars=600)
    continued = _messages(("assistant", received))
    body = _chat_body(continued, **OPEN)
    tokens = count_chat_tokens([c for _, c in continued], **OPEN)
    cached = text_block_hashes(render_chat(_messages()) + received, BLOCK)  # unpadded: a prefix
    prompt_only = len(text_block_hashes(render_chat(_messages()), BLOCK))
    assert len(cached) >= prompt_only + 8  # ~600 characters: 9 generated blocks
    hits = await _hits_of(session, url, "/v1/chat/completions", body)
    assert hits == min(len(cached) * BLOCK, tokens - 1)
    # After a reset the continuation finds nothing: the hits above were the cache's.
    async with session.post(f"{url}/reset_prefix_cache") as resp:
        assert resp.status == 200
    assert await _hits_of(session, url, "/v1/chat/completions", body) == 0


@pytest.mark.asyncio
@pytest.mark.parametrize("tail", ["", "xy"])
async def test_a_completions_continuation_hits_up_to_the_seam(sim, tail):
    session, url = sim
    prompt = "abcd" * 100 + tail  # 100 tokens, then (with a tail) a padded 101st
    async with session.post(
        f"{url}/v1/completions", json={"prompt": prompt, "max_tokens": 80}
    ) as resp:
        assert resp.status == 200
        text = (await resp.json())["choices"][0]["text"]
    continuation = {"prompt": prompt + text}
    hits = await _hits_of(session, url, "/v1/completions", continuation)
    if tail:  # the padded last prompt token differs: only the blocks before it are shared
        assert hits == (100 // BLOCK) * BLOCK
    else:  # the text re-tokenizes to the same tokens: prompt and generated blocks hit
        cached = text_block_hashes(render_text(prompt) + text, BLOCK)
        assert len(cached) > 100 // BLOCK + 3
        assert hits == min(len(cached) * BLOCK, count_text_tokens(prompt + text) - 1)
