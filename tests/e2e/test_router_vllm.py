"""The official openai client, unmodified, through the router to a real vLLM CPU engine.

The engine is the session's one shared ``vllm_demo_engine`` (tests/fixtures/vllm_engine.py);
the router is a real ``python -m runtime.gateway`` process reading a hand-built snapshot
(fixtures.router) published under a prefix of its own: one tenant with one API key, the three
request classes, the demo model with one version, pool ``cpu`` with ONE endpoint — the engine —
in state ready, capacity 8. The demo model's weights are random, so the tests check the
protocol (text arrives, usage, finish reasons), not the words. The engine runs on one CPU core:
``max_tokens`` stays small except in the disconnect test, which needs a long generation.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import openai
import pytest
from fixtures.router import Process, Publisher, World, http_get, limits, start_router, wait_ready
from fixtures.vllm_engine import VllmEngine

pytestmark = pytest.mark.e2e

MODEL = "demo-llama"
CHAT = [{"role": "user", "content": "Say something about trains."}]
LONG_MAX_TOKENS = 2000  # the prompt (19 tokens) + this fit the demo model's 2048 context
CANCEL_BOUND_S = 10.0
MIN_REST_TOKENS = 600  # an attempt needs this much generation left to show a cancel


@dataclass(frozen=True)
class Routed:
    router: Process
    key: str
    engine: VllmEngine

    @property
    def openai_base_url(self) -> str:
        return f"{self.router.base_url}/v1"


def demo_world(engine: VllmEngine) -> tuple[World, str]:
    world = World()
    world.add_class("interactive", band=0, deadline_ms=30_000)
    world.add_class("standard", band=1, deadline_ms=60_000)
    world.add_class("batch", band=2, deadline_ms=600_000)
    world.add_tenant(
        "acme",
        classes=("interactive", "standard", "batch"),
        default_class="standard",
        tenant_limits=limits(max_context=4096, max_output=2048),
    )
    key = world.add_key("demo", "acme")
    world.add_model(MODEL, 1)
    artifact = engine.artifact
    world.versions[1] = msgspec.structs.replace(
        world.versions[1],
        artifact_uri=artifact.uri,
        digest=artifact.digest,
        runtime="vllm",
        max_context=artifact.spec.max_context,
        tokenizer=str(artifact.path),
    )
    world.add_endpoint(1, 1, engine.base_url, state="ready", pool="cpu", capacity=8)
    return world, key


@pytest.fixture(scope="module")
def routed(
    vllm_demo_engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Routed]:
    publisher = Publisher(f"switchyard:test:e2e-router:{uuid.uuid4().hex[:12]}")
    router: Process | None = None
    try:
        world, key = demo_world(vllm_demo_engine)
        version = publisher.publish(world.snapshot())
        router = start_router(publisher.prefix, tmp_path_factory.mktemp("e2e-router-var"))
        wait_ready(router, version)
        yield Routed(router=router, key=key, engine=vllm_demo_engine)
    finally:
        if router is not None:
            router.stop()
        publisher.cleanup()


@pytest.fixture
def client(routed: Routed) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=routed.openai_base_url, api_key=routed.key, max_retries=0, timeout=120
    ) as client:
        yield client


# --- engine metrics -----------------------------------------------------------------------


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of the samples named ``name`` whose labels include ``labels``."""
    total = 0.0
    wanted = [f'{key}="{value}"' for key, value in labels.items()]
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] == name and all(part in head for part in wanted):
            total += float(value)
    return total


def engine_metrics(engine: VllmEngine) -> str:
    status, body = http_get(f"{engine.base_url}/metrics", timeout=5)
    assert status == 200
    return body.decode()


def generated(engine: VllmEngine, text: str | None = None) -> float:
    """The engine's generated-token counter."""
    return metric_sum(text or engine_metrics(engine), "vllm:generation_tokens_total")


def router_metrics(routed: Routed) -> str:
    status, body = http_get(f"{routed.router.base_url}/metrics", timeout=5)
    assert status == 200
    return body.decode()


def wait_idle(engine: VllmEngine, timeout_s: float) -> float:
    """Seconds until the engine runs and queues nothing; fails after ``timeout_s``."""
    started = time.monotonic()
    while True:
        text = engine_metrics(engine)
        busy = metric_sum(text, "vllm:num_requests_running") + metric_sum(
            text, "vllm:num_requests_waiting"
        )
        elapsed = time.monotonic() - started
        if busy == 0:
            return elapsed
        assert elapsed < timeout_s, f"the engine still has {busy:.0f} request(s) after {elapsed}s"
        time.sleep(0.05)


# --- the OpenAI API through the router ----------------------------------------------------


def test_lists_the_demo_model(client: openai.OpenAI) -> None:
    assert [model.id for model in client.models.list().data] == [MODEL]


def test_chat_completion(client: openai.OpenAI) -> None:
    result = client.chat.completions.create(
        model=MODEL, messages=CHAT, max_tokens=8, temperature=0.0
    )
    assert result.model == MODEL
    choice = result.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("length", "stop")
    assert result.usage is not None
    assert result.usage.prompt_tokens > 0
    assert 0 < result.usage.completion_tokens <= 8
    assert result.usage.total_tokens == result.usage.prompt_tokens + result.usage.completion_tokens


def test_chat_completion_streams_tokens_and_usage(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=8,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        # From the engine, token by token: test_chat_completion stored this deterministic
        # request's answer in the result cache, whose unary-stored entry replays as one chunk.
        extra_headers={"Cache-Control": "no-store"},
    )
    chunks = list(stream)
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert len([d for d in deltas if d]) >= 2, deltas  # tokens arrive one chunk at a time
    assert "".join(deltas)
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] in ("length", "stop")
    usage = chunks[-1].usage
    assert usage is not None
    assert not chunks[-1].choices  # the usage chunk carries no choice
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= 8


def test_completion(client: openai.OpenAI) -> None:
    result = client.completions.create(
        model=MODEL, prompt="The switchyard", max_tokens=8, temperature=0.0
    )
    choice = result.choices[0]
    assert isinstance(choice.text, str)
    assert choice.text
    assert choice.finish_reason in ("length", "stop")
    assert result.usage is not None
    assert result.usage.prompt_tokens > 0
    assert 0 < result.usage.completion_tokens <= 8


def test_completion_streams_tokens_and_usage(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model=MODEL,
        prompt="The switchyard",
        max_tokens=8,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_headers={"Cache-Control": "no-store"},  # from the engine (see the chat test)
    )
    chunks = list(stream)
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert len([t for t in texts if t]) >= 2, texts
    usage = chunks[-1].usage
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= 8


def test_request_class_and_timeout_headers(client: openai.OpenAI) -> None:
    """What README's 'Try it' shows: pick a class and a timeout per request."""
    result = client.chat.completions.create(
        model=MODEL,
        messages=CHAT,
        max_tokens=2,
        extra_headers={"X-Switchyard-Class": "interactive", "X-Request-Timeout": "20"},
    )
    assert result.usage is not None
    assert result.usage.completion_tokens > 0
    with pytest.raises(openai.PermissionDeniedError) as refused:
        client.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=2, extra_headers={"X-Switchyard-Class": "vip"}
        )
    assert "Request class 'vip' is not available" in str(refused.value)


def decode_rate(engine: VllmEngine) -> float:
    """The engine's tokens per second on one sequence: 64 greedy tokens, straight to it."""
    with openai.OpenAI(
        base_url=engine.openai_base_url, api_key="unused", max_retries=0, timeout=60
    ) as direct:
        started = time.monotonic()
        result = direct.chat.completions.create(
            model=MODEL, messages=CHAT, max_tokens=64, temperature=0.0
        )
        elapsed = time.monotonic() - started
    assert result.usage is not None
    return result.usage.completion_tokens / elapsed


@dataclass(frozen=True)
class Disconnect:
    before: float  # tokens the engine had generated for it when the client left
    after: float  # ... and after that
    idle_s: float  # seconds from the close until the engine ran nothing


def disconnect_after_first_chunk(routed: Routed) -> Disconnect | None:
    """Open a long stream, leave after its first chunk; None if, by the time the client saw
    that chunk, the engine had finished or nearly finished the generation (the client was
    starved of CPU on this shared machine: too little left to tell a cancel from a finish)."""
    engine = routed.engine
    wait_idle(engine, timeout_s=30)
    before = generated(engine)
    with openai.OpenAI(
        base_url=routed.openai_base_url, api_key=routed.key, max_retries=0, timeout=120
    ) as client:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=LONG_MAX_TOKENS,
            temperature=0.0,
            stream=True,
        )
        first = next(iter(stream))
        text = engine_metrics(engine)
        stream.close()  # the client goes away mid-stream
    assert first.choices
    assert first.choices[0].delta.role == "assistant"
    if metric_sum(text, "vllm:num_requests_running") == 0:
        return None
    idle_s = wait_idle(engine, timeout_s=CANCEL_BOUND_S)
    at_close = generated(engine, text)
    if LONG_MAX_TOKENS - (at_close - before) < MIN_REST_TOKENS:
        return None
    return Disconnect(before=at_close - before, after=generated(engine) - at_close, idle_s=idle_s)


@pytest.mark.timing  # measures how fast the engine goes idle after a disconnect
def test_disconnect_mid_stream_cancels_the_engine_request(routed: Routed) -> None:
    """The client leaves right after the first chunk of a long generation: the engine stops.

    Greedy decoding of this prompt runs to ``max_tokens`` (the demo model's random weights
    rarely emit EOS), which takes the engine LONG_MAX_TOKENS / its rate seconds.
    """
    rate = decode_rate(routed.engine)
    disconnects_before = metric_sum(
        router_metrics(routed), "switchyard_requests_total", outcome="client_disconnected"
    )
    seen = None
    for _attempt in range(3):
        seen = disconnect_after_first_chunk(routed)
        if seen is not None:
            break
    assert seen is not None, "three times the stream's first chunk came after most of the answer"
    rest = LONG_MAX_TOKENS - seen.before
    rest_s = rest / rate  # what finishing the generation would still have taken
    # Cancelled, not finished: idle long before the rest could have been generated, with only
    # a few more tokens, and the router saw the client go.
    assert seen.idle_s < min(CANCEL_BOUND_S, rest_s * 0.75), (
        f"engine idle {seen.idle_s:.2f} s after the disconnect; finishing would take "
        f"~{rest_s:.1f} s"
    )
    # Stopped, not finished: the engine generated clearly less than the rest of the answer.
    assert seen.after < rest - MIN_REST_TOKENS / 2, (
        f"{seen.after:.0f} tokens after the close, of {rest:.0f}"
    )
    router_text = router_metrics(routed)
    disconnects = metric_sum(
        router_text, "switchyard_requests_total", outcome="client_disconnected"
    )
    assert disconnects >= disconnects_before + 1, (disconnects_before, disconnects)
    inflight = metric_sum(router_text, "switchyard_inflight_requests")
    assert inflight == 0, f"{inflight} request(s) still in flight; idle after {seen.idle_s:.2f} s"
    print(  # shown with -s: the numbers behind the bounds
        f"disconnect → engine idle in {seen.idle_s:.2f} s; {seen.before:.0f} tokens before and "
        f"{seen.after:.0f} after the close; at {rate:.0f} tokens/s the remaining {rest:.0f} "
        f"would have taken ~{rest_s:.1f} s"
    )
