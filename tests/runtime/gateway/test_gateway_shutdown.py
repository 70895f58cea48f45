"""A router stopped with SIGTERM (a deploy, ``up`` stopping): in-flight streams finish first;
those still running when the grace period ends are cut with our terminal event.

A real router process and a simulator streaming at 50 tokens/s; SIGTERM arrives after the
first chunk of a ~1.2 s answer and well inside the grace period (``--graceful-shutdown-s``,
30 s by default): the stream still ends with its last chunk and ``[DONE]``, the router exits
cleanly afterwards, and nothing listens on its port any more.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from fixtures.net import port_accepts
from fixtures.router import Process, http_get, metric_value, spawn, wait_until_up
from fixtures.wait import eventually
from gateway_fleet import (
    Publisher,
    World,
    redis_url,
    start_router,
    start_simulator,
    wait_ready,
)

from runtime.gateway.errors import ERROR_KINDS

pytestmark = pytest.mark.integration

MODEL = "drain-chat"


def test_sigterm_lets_an_in_flight_stream_finish(tmp_path: Path) -> None:
    sim = start_simulator(MODEL, "--decode-a-ms", "20", "--decode-b-ms", "0")
    world = World()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, sim.base_url)
    world.add_tenant("acme")
    key = world.add_key("k", "acme")
    publisher = Publisher(f"switchyard:test:gw-drain:{uuid.uuid4().hex[:8]}")
    router = start_router(publisher.prefix, tmp_path)
    lines: list[str] = []
    try:
        wait_ready(router, publisher.publish(world.snapshot()))
        body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                "max_tokens": 60, "stream": True}  # fmt: skip
        headers = {"Authorization": f"Bearer {key}"}
        with httpx.stream(
            "POST", f"{router.base_url}/v1/chat/completions", json=body, headers=headers,
            timeout=30,
        ) as resp:  # fmt: skip
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if not line.startswith("data: "):
                    continue
                lines.append(line[6:])
                if len(lines) == 1:
                    signalled = time.monotonic()
                    router.proc.send_signal(signal.SIGTERM)
        finished_s = time.monotonic() - signalled
        # uvicorn re-raises SIGTERM once it has shut down cleanly
        assert router.proc.wait(timeout=20) in (0, -signal.SIGTERM), router.output()[-3000:]
        assert "Application shutdown complete" in router.output()
        exited_s = time.monotonic() - signalled
    finally:
        router.stop()
        sim.stop()
        publisher.cleanup()
    assert lines[-1] == "[DONE]", lines[-3:]
    finals = [json.loads(line) for line in lines[:-1]]
    assert [c["choices"][0]["finish_reason"] for c in finals if c["choices"]][-1] == "length"
    assert not port_accepts(router.port)
    print(f"\nstream finished {finished_s:.2f} s after SIGTERM; router exited at {exited_s:.2f} s")
    assert finished_s > 0.5  # it really ran on after the signal (60 tokens at 50/s)


def engine_running(sim: Process) -> float:
    _status, text = http_get(f"{sim.base_url}/metrics")
    return metric_value(text.decode(), "vllm:num_requests_running") or 0.0


def test_grace_end_cuts_streams_with_our_terminal_event(tmp_path: Path) -> None:
    """Requests still running when the grace period ends (``--graceful-shutdown-s 1``, answers
    of ~20 s): the stream ends with our ``router_shutdown`` terminal chunk and ``[DONE]``, not
    a bare close; a unary request not yet answered gets a 503 ``router_shutdown``."""
    sim = start_simulator(MODEL, "--decode-a-ms", "50", "--decode-b-ms", "0")
    world = World()
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, sim.base_url)
    world.add_tenant("acme")
    key = world.add_key("k", "acme")
    publisher = Publisher(f"switchyard:test:gw-cut:{uuid.uuid4().hex[:8]}")
    env = {
        **os.environ,
        "REDIS_URL": redis_url(),
        "SWITCHYARD_SNAPSHOT_PREFIX": publisher.prefix,
        "SWITCHYARD_VAR_DIR": str(tmp_path),
        "SWITCHYARD_KEY_USAGE_HASH": f"{publisher.prefix}:apikey:last_used",
    }
    router, _ = spawn(["runtime.gateway", "--graceful-shutdown-s", "1", "--workers", "1"], env=env)
    wait_until_up(router, "/healthz")
    headers = {"Authorization": f"Bearer {key}", "Cache-Control": "no-store"}
    url = f"{router.base_url}/v1/chat/completions"
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 400}
    lines: list[str] = []
    unary: list[httpx.Response] = []
    try:
        wait_ready(router, publisher.publish(world.snapshot()))
        with ThreadPoolExecutor(1) as pool:
            pending = pool.submit(
                httpx.post, url, json=body, headers=headers, timeout=30
            )  # unary: nothing is sent before the whole answer
            eventually(lambda: engine_running(sim) >= 1, timeout=20, interval=0.02)
            with httpx.stream(
                "POST", url, json={**body, "stream": True}, headers=headers, timeout=30
            ) as resp:
                assert resp.status_code == 200
                for line in resp.iter_lines():
                    if not line.startswith("data: "):
                        continue
                    lines.append(line[6:])
                    if len(lines) == 1:
                        signalled = time.monotonic()
                        router.proc.send_signal(signal.SIGTERM)
            ended_s = time.monotonic() - signalled
            unary.append(pending.result(timeout=30))
        assert router.proc.wait(timeout=20) in (0, -signal.SIGTERM), router.output()[-3000:]
    finally:
        router.stop()
        sim.stop()
        publisher.cleanup()
    print(f"\nstream cut {ended_s:.2f} s after SIGTERM (grace 1 s), {len(lines)} events")
    assert lines[-1] == "[DONE]", lines[-3:]
    terminal = json.loads(lines[-2])
    assert terminal["choices"][0]["finish_reason"] == "error"
    assert terminal["error"]["code"] == "router_shutdown"
    assert terminal["error"]["type"] == ERROR_KINDS["router_shutdown"].type
    assert terminal["id"] == json.loads(lines[0])["id"]  # the stream's own id
    assert 0.9 < ended_s < 6.0  # cut at the grace's end, not at the answer's (~20 s)
    assert unary[0].status_code == 503
    assert unary[0].json()["error"]["code"] == "router_shutdown"
