"""Failures around a live stream: client disconnect, dead endpoints, broken streams, deadlines."""

from __future__ import annotations

import json
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from fixtures.wait import eventually
from gateway_fleet import (
    Process,
    Publisher,
    World,
    http_get,
    metric_value,
    start_router,
    start_simulator,
    wait_ready,
)

pytestmark = pytest.mark.integration

STEADY = "steady-chat"  # 50 ms per decode step: a 200-token answer takes ~10 s
FLAKY = "flaky-chat"  # cuts every generation after 3 tokens
PAIR = "pair-chat"  # two endpoints; tests kill one
MESSAGES = [{"role": "user", "content": "Tell me a long story"}]


class FailureFleet:
    def __init__(self, var_dir: Path) -> None:
        self.publisher = Publisher(f"switchyard:test:gw-failures:{uuid.uuid4().hex[:12]}")
        self.world = World()
        self.sims: dict[str, Process] = {}
        self.router: Process | None = None
        self.var_dir = var_dir
        self.next_endpoint = 10

    def start(self) -> None:
        self.sims["steady"] = start_simulator(STEADY, "--decode-a-ms", "50")
        self.sims["flaky"] = start_simulator(FLAKY, "--fail-after-tokens", "3")
        self.world.add_class("interactive", band=0, deadline_ms=60_000)
        self.world.add_tenant("acme", classes=("interactive",), default_class="interactive")
        self.world.add_key("good", "acme")
        self.world.add_model(STEADY, 1)
        self.world.add_model(FLAKY, 2)
        self.world.add_model(PAIR, 3)
        self.world.add_endpoint(1, 1, self.sims["steady"].base_url)
        self.world.add_endpoint(2, 2, self.sims["flaky"].base_url)
        version = self.publisher.publish(self.world.snapshot())
        self.router = start_router(self.publisher.prefix, self.var_dir)
        wait_ready(self.router, version)

    @property
    def base_url(self) -> str:
        assert self.router is not None
        return self.router.base_url

    @property
    def key(self) -> str:
        return self.world.secrets["good"]

    def set_pair(self, sims: list[Process]) -> list[int]:
        """Make ``sims`` the endpoints of PAIR (fresh ids) and wait for the router to see it."""
        for endpoint_id in [e for e, ep in self.world.endpoints.items() if ep.version == 3]:
            del self.world.endpoints[endpoint_id]
        ids = []
        for sim in sims:
            self.next_endpoint += 1
            self.world.add_endpoint(self.next_endpoint, 3, sim.base_url)
            ids.append(self.next_endpoint)
        assert self.router is not None
        wait_ready(self.router, self.publisher.publish(self.world.snapshot()))
        return ids

    def stop(self) -> None:
        if self.router is not None:
            self.router.stop()
        for sim in self.sims.values():
            sim.stop()
        self.publisher.cleanup()


@pytest.fixture(scope="module")
def ff(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FailureFleet]:
    fleet = FailureFleet(tmp_path_factory.mktemp("failures-var"))
    try:
        fleet.start()
        yield fleet
    finally:
        fleet.stop()


def running(sim: Process) -> float:
    _, body = http_get(f"{sim.base_url}/metrics")
    value = metric_value(body.decode(), "vllm:num_requests_running")
    assert value is not None
    return value


def wait_for(predicate, timeout_s: float) -> float:  # type: ignore[no-untyped-def]
    """Poll ``predicate`` until true; returns the seconds it took, fails after ``timeout_s``."""
    started = time.monotonic()
    eventually(predicate, timeout=timeout_s)
    return time.monotonic() - started


def raw_stream_request(base_url: str, key: str, body: dict[str, object]) -> socket.socket:
    """Send a streaming request on a bare socket (so the test controls the disconnect)."""
    host, port = base_url.removeprefix("http://").split(":")
    payload = json.dumps(body).encode()
    sock = socket.create_connection((host, int(port)), timeout=10)
    sock.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\n"
        + f"Host: {host}\r\nAuthorization: Bearer {key}\r\n".encode()
        + b"Content-Type: application/json\r\n"
        + f"Content-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return sock


def test_client_disconnect_mid_stream_cancels_upstream_at_once(ff: FailureFleet) -> None:
    steady = ff.sims["steady"]
    assert running(steady) == 0
    body = {"model": STEADY, "messages": MESSAGES, "max_tokens": 200, "stream": True}
    sock = raw_stream_request(ff.base_url, ff.key, body)
    received = b""
    while received.count(b"data: ") < 3:  # a few tokens in: the stream is live
        chunk = sock.recv(65536)
        assert chunk, "stream ended early"
        received += chunk
    assert received.startswith(b"HTTP/1.1 200")
    assert running(steady) == 1
    sock.close()  # the client goes away ~10 s before the answer would be complete
    took = wait_for(lambda: running(steady) == 0, timeout_s=2.0)
    print(f"engine freed {took * 1000:.0f} ms after the client disconnected")
    _, metrics = http_get(f"{ff.base_url}/metrics")
    text = metrics.decode()
    assert 'outcome="client_disconnected"' in text
    assert 'switchyard_inflight_requests{endpoint="1"} 0.0' in text


def test_streaming_client_closing_the_openai_stream_frees_the_engine(ff: FailureFleet) -> None:
    client = openai.OpenAI(base_url=f"{ff.base_url}/v1", api_key=ff.key, max_retries=0)
    stream = client.chat.completions.create(
        model=STEADY, messages=MESSAGES, max_tokens=200, stream=True
    )
    for index, _ in enumerate(stream):
        if index == 2:
            break
    stream.close()
    wait_for(lambda: running(ff.sims["steady"]) == 0, timeout_s=2.0)


def test_upstream_failure_after_first_byte_ends_with_a_terminal_error_event(
    ff: FailureFleet,
) -> None:
    body = {"model": FLAKY, "messages": MESSAGES, "max_tokens": 20, "stream": True}
    resp = httpx.post(
        f"{ff.base_url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {ff.key}"},
        timeout=30,
    )
    assert resp.status_code == 200
    events = [e.removeprefix("data: ") for e in resp.text.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["object"] == "chat.completion.chunk"
    assert last["choices"] == [{"index": 0, "delta": {}, "finish_reason": "error"}]
    assert last["error"]["code"] == "stream_broken"
    assert last["error"]["type"] == "upstream_error"
    assert last["id"] == json.loads(events[0])["id"]
    tokens = [json.loads(e) for e in events[:-2]]
    assert sum(bool(t["choices"][0]["delta"].get("content")) for t in tokens) == 3

    client = openai.OpenAI(base_url=f"{ff.base_url}/v1", api_key=ff.key, max_retries=0)
    with pytest.raises(openai.APIError):
        list(
            client.chat.completions.create(
                model=FLAKY, messages=MESSAGES, max_tokens=20, stream=True
            )
        )
    completion = httpx.post(
        f"{ff.base_url}/v1/completions",
        json={"model": FLAKY, "prompt": "x", "max_tokens": 20, "stream": True},
        headers={"Authorization": f"Bearer {ff.key}"},
        timeout=30,
    )
    events = [e.removeprefix("data: ") for e in completion.text.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    assert json.loads(events[-2])["choices"] == [{"index": 0, "text": "", "finish_reason": "error"}]


def test_deadline_mid_stream_ends_with_a_deadline_event(ff: FailureFleet) -> None:
    body = {"model": STEADY, "messages": MESSAGES, "max_tokens": 200, "stream": True}
    started = time.monotonic()
    resp = httpx.post(
        f"{ff.base_url}/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {ff.key}", "X-Request-Timeout": "1"},
        timeout=30,
    )
    assert time.monotonic() - started < 3.0
    events = [e.removeprefix("data: ") for e in resp.text.strip().split("\n\n")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "error"
    assert last["error"]["code"] == "deadline_exceeded"
    wait_for(lambda: running(ff.sims["steady"]) == 0, timeout_s=2.0)


def test_a_killed_endpoint_is_avoided_and_requests_still_succeed(ff: FailureFleet) -> None:
    first, second = start_simulator(PAIR), start_simulator(PAIR)
    try:
        ff.set_pair([first, second])
        client = openai.OpenAI(base_url=f"{ff.base_url}/v1", api_key=ff.key, max_retries=0)
        first.kill()
        for _ in range(8):
            result = client.chat.completions.create(model=PAIR, messages=MESSAGES, max_tokens=2)
            assert result.choices[0].message.content
        streamed = list(
            client.chat.completions.create(model=PAIR, messages=MESSAGES, max_tokens=2, stream=True)
        )
        assert streamed[-1].choices[0].finish_reason == "length"
        second.kill()
        with pytest.raises(openai.InternalServerError) as info:
            client.chat.completions.create(model=PAIR, messages=MESSAGES, max_tokens=2)
        assert info.value.status_code == 503
    finally:
        first.stop()
        second.stop()


def test_an_endpoint_killed_mid_stream_gives_the_terminal_error_event(ff: FailureFleet) -> None:
    sim = start_simulator(PAIR, "--decode-a-ms", "50")
    try:
        ff.set_pair([sim])
        body = {"model": PAIR, "messages": MESSAGES, "max_tokens": 200, "stream": True}
        with httpx.stream(
            "POST",
            f"{ff.base_url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {ff.key}"},
            timeout=30,
        ) as resp:
            assert resp.status_code == 200
            frames: list[str] = []
            for line in resp.iter_lines():
                if line:
                    frames.append(line.removeprefix("data: "))
                if len(frames) == 3:
                    sim.kill()
        assert frames[-1] == "[DONE]"
        last = json.loads(frames[-2])
        assert last["choices"][0]["finish_reason"] == "error"
        assert last["error"]["code"] == "stream_broken"
    finally:
        sim.stop()
