"""Stream migration through a real router process over vLLM simulators: a stream whose
engine breaks mid-generation goes on on the other endpoint, as one stream (same id, one role
chunk, every token once in the usage), and the router's /metrics count it. The exactness
against real vLLM and the kill -9 chaos run are in tests/e2e/test_vllm_resume.py."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from gateway_fleet import (
    Process,
    Publisher,
    World,
    http_get,
    start_router,
    start_simulator,
    wait_ready,
)

pytestmark = pytest.mark.integration

MODEL = "pair-chat"
MAX_TOKENS = 12
STREAMS = 4  # concurrent: least-load placement puts some on each endpoint


class PairFleet:
    """One model on two simulators: ``flaky`` cuts every generation after 3 tokens."""

    def __init__(self, var_dir: Path) -> None:
        self.publisher = Publisher(f"switchyard:test:migrate:{uuid.uuid4().hex[:12]}")
        self.sims = {
            "flaky": start_simulator(MODEL, "--fail-after-tokens", "3", "--decode-a-ms", "20"),
            "steady": start_simulator(MODEL, "--decode-a-ms", "20"),
        }
        world = World()
        world.add_class("interactive", band=0, deadline_ms=60_000)
        world.add_tenant("acme", classes=("interactive",), default_class="interactive")
        world.add_key("good", "acme")
        world.add_model(MODEL, 1)
        world.add_endpoint(1, 1, self.sims["flaky"].base_url)
        world.add_endpoint(2, 1, self.sims["steady"].base_url)
        self.key = world.secrets["good"]
        version = self.publisher.publish(world.snapshot())
        self.router: Process = start_router(self.publisher.prefix, var_dir)
        wait_ready(self.router, version)

    def stop(self) -> None:
        self.router.stop()
        for sim in self.sims.values():
            sim.stop()
        self.publisher.cleanup()

    def stream(self, path: str, body: dict[str, object]) -> list[dict[str, object]]:
        resp = httpx.post(f"{self.router.base_url}{path}", json=body, timeout=30,
                          headers={"Authorization": f"Bearer {self.key}"})  # fmt: skip
        assert resp.status_code == 200, resp.text
        frames = [f.removeprefix("data: ") for f in resp.text.strip().split("\n\n")]
        assert frames[-1] == "[DONE]"
        return [json.loads(frame) for frame in frames[:-1]]

    def metrics(self) -> str:
        status, body = http_get(f"{self.router.base_url}/metrics")
        assert status == 200
        return body.decode()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PairFleet]:
    fleet = PairFleet(tmp_path_factory.mktemp("migrate-var"))
    try:
        yield fleet
    finally:
        fleet.stop()


def resumed(text: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith("switchyard_stream_resumes_total{") and 'outcome="resumed"' in line:
            total += float(line.rpartition(" ")[2])
    return total


def test_streams_broken_mid_generation_finish_on_the_other_endpoint(pair: PairFleet) -> None:
    before = resumed(pair.metrics())
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me a story"}],
            "max_tokens": MAX_TOKENS, "stream": True,
            "stream_options": {"include_usage": True}}  # fmt: skip
    with ThreadPoolExecutor(STREAMS) as pool:
        streams = list(
            pool.map(lambda _: pair.stream("/v1/chat/completions", body), range(STREAMS))
        )
    for chunks in streams:
        usage = chunks[-1]["usage"]
        choices = [c["choices"][0] for c in chunks if c["choices"]]  # type: ignore[index]
        assert all("error" not in c for c in chunks), chunks[-2:]
        assert len({c["id"] for c in chunks}) == 1
        assert sum("role" in c["delta"] for c in choices) == 1  # the client's one opening
        tokens = [c for c in choices if "role" not in c["delta"]]
        assert len(tokens) == MAX_TOKENS
        assert choices[-1]["finish_reason"] == "length"
        assert usage["completion_tokens"] == MAX_TOKENS  # type: ignore[index]
    migrated = resumed(pair.metrics()) - before
    assert 1 <= migrated <= STREAMS
    text = pair.metrics()
    assert "switchyard_resume_reprefill_tokens_total" in text
    assert "switchyard_resume_seconds_count" in text


def test_a_completion_stream_migrates_and_a_client_without_usage_gets_none(pair: PairFleet) -> None:
    body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": MAX_TOKENS,
            "stream": True}  # fmt: skip
    with ThreadPoolExecutor(STREAMS) as pool:
        streams = list(pool.map(lambda _: pair.stream("/v1/completions", body), range(STREAMS)))
    for chunks in streams:
        assert all("error" not in c and "usage" not in c for c in chunks), chunks[-2:]
        assert len({c["id"] for c in chunks}) == 1
        assert len(chunks) == MAX_TOKENS
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]


def test_with_one_endpoint_left_the_break_is_todays_terminal_event(pair: PairFleet) -> None:
    """Both endpoints break in turn (the flaky one, then the steady one is killed): the
    stream ends with the terminal error event once no endpoint is left."""
    sim = pair.sims["steady"]
    sim.kill()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Tell me"}],
            "max_tokens": MAX_TOKENS, "stream": True}  # fmt: skip
    chunks = pair.stream("/v1/chat/completions", body)
    assert chunks[-1]["choices"][0]["finish_reason"] == "error"  # type: ignore[index]
    assert chunks[-1]["error"]["code"] == "stream_broken"  # type: ignore[index]
