"""Resume by continuation and stream migration against real vLLM CPU, through a real router.

The exactness bound (runtime/gateway/resume.py): with greedy decoding, a stream cut after k
tokens and resumed is the uninterrupted stream, when the tokenization round-trips. The
router's two endpoints are two cut proxies (tests/fixtures/cut_proxy.py) in front of the
session's one engine; an armed proxy cuts the next stream after k events, and the router
resumes it on the other. The chaos test starts a second engine, puts 8 streams on the two
engines and kills -9 the second one mid-stream: every stream completes on the survivor. A
stream cut and resumed by token ids on the same engine hits every full block of its prompt
and generated tokens in the engine's prefix cache (what resume affinity relies on).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
from fixtures.cut_proxy import CutProxies
from fixtures.net import free_port
from fixtures.router import Process, Publisher, World, http_get, limits, start_router, wait_ready
from fixtures.vllm_engine import (
    DEMO_SERVED_NAME,
    ENGINE_START_TIMEOUT_S,
    SupervisorThread,
    VllmEngine,
)
from fixtures.wait import eventually

from runtime.workers.supervisor import SupervisorSettings

pytestmark = pytest.mark.e2e

PROMPT = "user: hello, what is"  # the demo model's greedy answer to it round-trips (see below)
N_TOKENS = 24
CHAOS_STREAMS = 8
CHAOS_TOKENS = 120


def world_for(engine: VllmEngine, urls: list[str]) -> tuple[World, str]:
    world = World()
    world.add_class("interactive", band=0, deadline_ms=120_000)
    world.add_tenant("acme", classes=("interactive",), default_class="interactive",
                     tenant_limits=limits(max_context=4096, max_output=2048))  # fmt: skip
    key = world.add_key("demo", "acme")
    world.add_model(DEMO_SERVED_NAME, 1)
    artifact = engine.artifact
    world.versions[1] = msgspec.structs.replace(
        world.versions[1], artifact_uri=artifact.uri, digest=artifact.digest, runtime="vllm",
        max_context=artifact.spec.max_context, tokenizer=str(artifact.path),
    )  # fmt: skip
    for endpoint_id, url in enumerate(urls, start=1):
        world.add_endpoint(endpoint_id, 1, url, state="ready", pool="cpu", capacity=8)
    return world, key


@dataclass
class Routed:
    router: Process
    key: str

    def stream(self, path: str, body: dict[str, Any]) -> list[dict[str, Any]]:
        resp = httpx.post(f"{self.router.base_url}{path}", json=body, timeout=300,
                          headers={"Authorization": f"Bearer {self.key}"})  # fmt: skip
        assert resp.status_code == 200, resp.text
        frames = [f.removeprefix("data: ") for f in resp.text.strip().split("\n\n")]
        assert frames[-1] == "[DONE]"
        return [json.loads(frame) for frame in frames[:-1]]

    def resume_lines(self) -> list[str]:
        status, body = http_get(f"{self.router.base_url}/metrics")
        assert status == 200
        return [
            line for line in body.decode().splitlines() if line.startswith("switchyard_stream_")
        ]

    def resumed(self) -> float:
        return sum(
            float(line.rpartition(" ")[2])
            for line in self.resume_lines()
            if line.startswith("switchyard_stream_resumes_total{") and 'outcome="resumed"' in line
        )


def routed_over(engine: VllmEngine, urls: list[str], var: Any) -> Iterator[Routed]:
    publisher = Publisher(f"switchyard:test:e2e-resume:{uuid.uuid4().hex[:12]}")
    router: Process | None = None
    try:
        world, key = world_for(engine, urls)
        version = publisher.publish(world.snapshot())
        router = start_router(publisher.prefix, var)
        wait_ready(router, version)
        yield Routed(router=router, key=key)
    finally:
        if router is not None:
            router.stop()
        publisher.cleanup()


@pytest.fixture(scope="module")
def proxies(vllm_demo_engine: VllmEngine) -> Iterator[CutProxies]:
    port = int(vllm_demo_engine.base_url.rsplit(":", 1)[1])
    with CutProxies(port, 2) as cut:
        yield cut


@pytest.fixture(scope="module")
def cut_routed(
    vllm_demo_engine: VllmEngine, proxies: CutProxies, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Routed]:
    urls = [f"http://127.0.0.1:{port}" for port in proxies.ports]
    yield from routed_over(vllm_demo_engine, urls, tmp_path_factory.mktemp("resume-var"))


def texts(chunks: list[dict[str, Any]], kind: str) -> list[str]:
    """The generated pieces, one per token chunk (a chat stream's role chunk left out)."""
    pieces = []
    for chunk in chunks:
        for choice in chunk["choices"]:
            if kind == "chat":
                if "role" not in choice["delta"]:
                    pieces.append(choice["delta"].get("content") or "")
            else:
                pieces.append(choice["text"])
    return pieces


def test_a_greedy_completion_cut_after_k_tokens_and_resumed_equals_the_uninterrupted_one(
    cut_routed: Routed, proxies: CutProxies, vllm_demo_engine: VllmEngine
) -> None:
    from transformers import AutoTokenizer  # noqa: PLC0415 - heavy, only this test needs it

    body = {"model": DEMO_SERVED_NAME, "prompt": PROMPT, "max_tokens": N_TOKENS,
            "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    whole = cut_routed.stream("/v1/completions", {**body, "return_token_ids": True})  # not cached
    ids = [i for c in whole for choice in c["choices"] for i in choice.get("token_ids") or []]
    pieces = texts(whole, "completion")  # a loaded engine may merge tokens into a chunk
    assert len(ids) == N_TOKENS
    tokenizer = AutoTokenizer.from_pretrained(str(vllm_demo_engine.artifact.path))
    base = tokenizer(PROMPT).input_ids
    # the bound's condition, at every token: prompt + text so far tokenizes back to the same
    # ids (the cut's chunk boundaries depend on the engine's load)
    misses = [
        k
        for k in range(1, N_TOKENS)
        if tokenizer(PROMPT + tokenizer.decode(ids[:k])).input_ids != base + ids[:k]
    ]
    assert not misses, f"the answer does not round-trip at {misses}: pick another prompt"
    before = cut_routed.resumed()
    proxies.arm(min(6, len(pieces) - 1))
    resumed = cut_routed.stream("/v1/completions", body)
    assert proxies.cuts >= 1
    assert cut_routed.resumed() == before + 1
    assert all("error" not in c for c in resumed)
    assert "".join(texts(resumed, "completion")) == "".join(pieces)
    assert len({c["id"] for c in resumed}) == 1
    assert resumed[-1]["usage"] == whole[-1]["usage"]  # prompt once, every token once


def test_a_cut_chat_stream_goes_on_as_one_stream(cut_routed: Routed, proxies: CutProxies) -> None:
    body = {"model": DEMO_SERVED_NAME, "max_tokens": N_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "Tell me about the trains."}]}  # fmt: skip
    whole = cut_routed.stream("/v1/chat/completions", {**body, "seed": 1})  # not a cache hit
    # vLLM's chat stream skips a step whose bytes are not text yet: fewer chunks than tokens
    assert len(texts(whole, "chat")) >= 3, whole
    before = cut_routed.resumed()
    proxies.arm(3)  # the role chunk and two token chunks, then the cut
    resumed = cut_routed.stream("/v1/chat/completions", {**body, "seed": 2})
    assert cut_routed.resumed() == before + 1, (proxies.cuts, cut_routed.resume_lines(), resumed)
    assert all("error" not in c for c in resumed)
    assert len({c["id"] for c in resumed}) == 1
    assert sum("role" in ch["delta"] for c in resumed for ch in c["choices"]) == 1
    pieces = texts(resumed, "chat")
    assert pieces[:2] == texts(whole, "chat")[:2]  # what was streamed before the cut stands
    assert resumed[-1]["usage"]["completion_tokens"] >= len(pieces)
    assert resumed[-1]["choices"] == []


# --- chaos: kill -9 one of two engines under 8 streams ------------------------------------


@pytest.fixture
def second_engine(vllm_demo_engine: VllmEngine) -> Iterator[SupervisorThread]:
    """One more engine on the same model (the session's engine is the survivor)."""
    spec = dataclasses.replace(  # its own ports: HTTP and the KV-events publisher
        vllm_demo_engine.spec, port=free_port(), kv_events_port=free_port()
    )
    runner = SupervisorThread(spec, SupervisorSettings(
        start_timeout_s=ENGINE_START_TIMEOUT_S, stop_timeout_s=10.0, grace_s=0.0,
        handle_signals=False, engine_log=vllm_demo_engine.log_path.with_name("victim.log"),
    ))  # fmt: skip
    runner.start()
    try:
        runner.wait_ready(ENGINE_START_TIMEOUT_S)
        yield runner
    finally:
        runner.stop()


@pytest.mark.timeout(900)  # a second vLLM CPU engine starts in it (~1 min quiet, more loaded)
def test_a_resume_on_the_same_engine_hits_its_prompt_and_generated_blocks(
    vllm_demo_engine: VllmEngine,
) -> None:
    # what resume affinity relies on (runtime/scheduling/resume_home.py): vLLM keeps an
    # aborted request's blocks cached, the generated tokens' full blocks included
    from bench.resume_vllm import BLOCK_TOKENS, one_round  # noqa: PLC0415

    with httpx.Client(timeout=120) as client:
        resume = one_round(client, vllm_demo_engine.base_url, arm="warm",
                           seed=uuid.uuid4().int % 10**9, prompt_tokens=600, cut=300, tail=4,
                           max_len=vllm_demo_engine.artifact.spec.max_context)  # fmt: skip
    assert resume is not None
    assert resume.generated == 300
    assert resume.round_trips  # by token ids: always
    assert resume.context_tokens == resume.prompt_tokens + 300
    assert resume.hit_tokens == resume.full_hit  # every full block of the context
    assert resume.generated_hit >= 2 * BLOCK_TOKENS  # the generated tokens' blocks among them


def test_kill_9_of_one_engine_under_8_streams_every_stream_completes_on_the_survivor(
    vllm_demo_engine: VllmEngine, second_engine: SupervisorThread,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:  # fmt: skip
    urls = [vllm_demo_engine.base_url, second_engine.supervisor.spec.base_url]
    routed = routed_over(vllm_demo_engine, urls, tmp_path_factory.mktemp("chaos-var"))
    target = next(routed)
    try:
        _chaos(target, second_engine)
    finally:
        routed.close()


def _chaos(target: Routed, victim: SupervisorThread) -> None:
    # completions: one chunk per token, so the count is exact; prompts differ in their first
    # characters, so the prefix affinity spreads them over both engines
    usage = {"include_usage": True}
    body = {"model": DEMO_SERVED_NAME, "max_tokens": CHAOS_TOKENS, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": usage}  # fmt: skip
    bodies = [{**body, "prompt": f"{i} {PROMPT}"} for i in range(CHAOS_STREAMS)]
    progress = [0] * CHAOS_STREAMS

    def one(i: int) -> list[dict[str, Any]]:
        chunks = []
        with httpx.stream("POST", f"{target.router.base_url}/v1/completions", json=bodies[i],
                          headers={"Authorization": f"Bearer {target.key}"},
                          timeout=300) as resp:  # fmt: skip
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(json.loads(line.removeprefix("data: ")))
                    progress[i] = len(chunks)
        return chunks

    engine = victim.supervisor.engine
    assert engine is not None
    victim_url = victim.supervisor.spec.base_url
    with ThreadPoolExecutor(CHAOS_STREAMS) as pool:
        futures = [pool.submit(one, i) for i in range(CHAOS_STREAMS)]
        eventually(lambda: min(progress) >= 4, timeout=120, what="every stream under way")
        on_victim = running(victim_url)
        killed_at = time.monotonic()
        os.killpg(engine.pid, signal.SIGKILL)  # the engine's whole process group
        streams = [f.result(timeout=300) for f in futures]
    assert on_victim >= 1, "no stream was on the engine killed"
    for chunks in streams:
        assert all("error" not in c for c in chunks), chunks[-2:]
        assert len({c["id"] for c in chunks}) == 1
        # a loaded vLLM merges the deltas its API server has not sent yet: a chunk can carry
        # several tokens, so the chunks are at most the tokens
        assert 0 < len(texts(chunks, "completion")) <= CHAOS_TOKENS
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] == CHAOS_TOKENS, target.resume_lines()
    assert target.resumed() >= on_victim, target.resume_lines()
    print(f"{on_victim} of {CHAOS_STREAMS} streams moved; all done "
          f"{time.monotonic() - killed_at:.1f} s after the kill")  # fmt: skip


def running(base_url: str) -> float:
    """The engine's running requests (vllm:num_requests_running)."""
    status, body = http_get(f"{base_url}/metrics", timeout=5)
    assert status == 200
    return sum(
        float(line.rpartition(" ")[2])
        for line in body.decode().splitlines()
        if line.startswith("vllm:num_requests_running")
    )
