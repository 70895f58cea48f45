"""The streaming post-filter's early stop against a real vLLM CPU engine (issue #31's goal):
a banned word in a stream is stopped within one chunk of appearing, and the engine frees the
sequence within 100 ms, read from its own ``vllm:num_requests_running`` gauge.

The engine is the session's shared ``vllm_demo_engine``; the router is a real process reading
a hand-built snapshot (``test_router_vllm.demo_world``). The demo model's weights are random,
so the banned word is learnt first: a greedy (temperature 0, seeded) stream without a pack
shows which word the model emits mid-stream; then a pack whose ``stop`` rule matches that word
is published, and the same request is streamed again with the unmodified ``openai`` client.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import openai
import pytest
from fixtures.router import Publisher, World, start_router, wait_ready
from fixtures.vllm_engine import VllmEngine
from fixtures.wait import eventually
from test_router_vllm import MODEL, Routed, demo_world, engine_metrics, generated, metric_sum

from runtime.snapshot import PolicyPackSnap, SafetyRuleSnap, SafetySnap

pytestmark = pytest.mark.e2e

MAX_TOKENS = 160  # long enough that the engine is still generating when the stop comes
FREED_BOUND_S = 0.1  # the goal: the engine's slot is free within 100 ms of the stop
FAIL_AFTER_S = 10.0  # a slot never freed fails here
REQUEST = {
    "model": MODEL,
    "messages": [{"role": "user", "content": "Say something about trains."}],
    "max_tokens": MAX_TOKENS,
    "temperature": 0.0,
    "seed": 7,
    "stream": True,
    "stream_options": {"include_usage": True},
    # From the engine each time: a cached answer would replay without any engine slot.
    "extra_headers": {"Cache-Control": "no-store"},
}


@dataclass(frozen=True)
class Setup:
    route: Routed
    publisher: Publisher
    world: World  # what the router serves; republished with a pack


@pytest.fixture(scope="module")
def setup(
    vllm_demo_engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Setup]:
    publisher = Publisher(f"switchyard:test:e2e-safety:{uuid.uuid4().hex[:12]}")
    router = None
    try:
        world, key = demo_world(vllm_demo_engine)
        version = publisher.publish(world.snapshot())
        router = start_router(publisher.prefix, tmp_path_factory.mktemp("e2e-safety-var"))
        wait_ready(router, version)
        yield Setup(Routed(router=router, key=key, engine=vllm_demo_engine), publisher, world)
    finally:
        if router is not None:
            router.stop()
        publisher.cleanup()


def running(engine: VllmEngine) -> float:
    return metric_sum(engine_metrics(engine), "vllm:num_requests_running")


def banned_word(deltas: list[str]) -> tuple[str, int, int, int]:
    """A word of the greedy answer, its start in the text, the (0-based) content chunk that
    completes it and where that chunk ends in the text: the first word of 3+ letters, from the
    4th chunk on, in the first half of the answer, that appears nowhere earlier."""
    text = "".join(deltas)
    ends = [sum(len(d) for d in deltas[: i + 1]) for i in range(len(deltas))]
    for match in re.finditer(r"[A-Za-z]{3,}", text):
        word, start = match.group(), match.start()
        chunk = next(i for i, end in enumerate(ends) if end >= match.end())
        if 3 <= chunk <= len(deltas) // 2 and text.find(word) == start:
            return word, start, chunk, ends[chunk]
    pytest.fail(f"no usable word in the greedy answer: {text!r}")


def test_a_banned_word_stops_the_stream_and_frees_the_engine_slot(setup: Setup) -> None:
    route, publisher = setup.route, setup.publisher
    engine = route.engine
    with openai.OpenAI(
        base_url=route.openai_base_url, api_key=route.key, max_retries=0, timeout=60
    ) as client:
        # 1. Learn a word the model emits mid-stream (no pack yet).
        chunks = list(client.chat.completions.create(**REQUEST))  # type: ignore[call-overload]
        deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
        deltas = [d for d in deltas if d]
        assert chunks[-1].usage is not None
        full_tokens = chunks[-1].usage.completion_tokens
        word, start, chunk, chunk_end = banned_word(deltas)

        # 2. A pack that stops on that word, attached to the tenant.
        pack = PolicyPackSnap(name="stopper", version=1, rules=(
            SafetyRuleSnap(id="banned", kind="regex", action="stop",
                           patterns=(re.escape(word),)),))  # fmt: skip
        safety = SafetySnap(packs={"stopper": pack}, tenants={"acme": ("stopper",)})
        snapshot = msgspec.structs.replace(setup.world.snapshot(), safety=safety)
        version = publisher.publish(snapshot)
        wait_ready(route.router, version)
        assert running(engine) == 0
        tokens_before = generated(engine)

        # 3. The same request again: stopped at the word, the engine's slot freed at once.
        stream = client.chat.completions.create(**REQUEST)  # type: ignore[call-overload]
        received: list[str] = []
        finish = None
        busy = 0.0  # the gauge while the sequence runs: it shows the slot taken
        for item in stream:
            if item.choices and item.choices[0].finish_reason is not None:
                finish = item.choices[0].finish_reason
                received.append(item.choices[0].delta.content or "")
                stopped_at = time.monotonic()
                break
            if item.choices and item.choices[0].delta.content:
                received.append(item.choices[0].delta.content)
                if len(received) == 2:
                    busy = running(engine)
        else:
            pytest.fail("the stream ended without a finish reason")
        # Polled every 5 ms (each poll is an HTTP GET of /metrics: a few ms of its own, counted).
        eventually(lambda: running(engine) == 0, timeout=FAIL_AFTER_S, interval=0.005,
                   what="the engine freeing the stopped sequence")  # fmt: skip
        freed_s = time.monotonic() - stopped_at
        rest = list(stream)  # the usage chunk, then [DONE]

    assert finish == "content_filter"
    assert busy == 1, "the engine's running gauge did not show the sequence"
    # The client got the answer up to the word and nothing after the chunk that completes it:
    # chunks pass as they come, so a word's head may already be out; a match ending at a
    # chunk's end on a letter waits for the next chunk (the word may go on), so a word that
    # ends exactly at a chunk boundary is out whole and the stop comes with the next chunk.
    text, full = "".join(received), "".join(deltas)
    assert full.startswith(text), (text, full)
    assert start <= len(text) <= chunk_end, (text, word, chunk_end)
    usage = rest[-1].usage
    assert usage is not None
    # Stopped within one chunk of the word: the chunk that completes it (chunk + 1 tokens) or
    # the next one, with one token of slack for a token that carries no text.
    assert usage.completion_tokens <= chunk + 3, (usage, chunk)
    print(f"\nslot freed {freed_s * 1000:.1f} ms after the stop (word {word!r}, chunk {chunk},"
          f" {usage.completion_tokens} of {full_tokens} tokens)")  # fmt: skip
    assert freed_s <= FREED_BOUND_S, f"the engine freed the slot after {freed_s * 1000:.0f} ms"
    # The engine generated far fewer tokens than the unstopped answer: it aborted the sequence.
    assert generated(engine) - tokens_before < full_tokens
