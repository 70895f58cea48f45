"""A router stopped with SIGTERM (a deploy, ``up`` stopping): in-flight streams finish first.

A real router process and a simulator streaming at 50 tokens/s; SIGTERM arrives after the
first chunk of a ~1.2 s answer and well inside the grace period (``--graceful-shutdown-s``,
30 s by default): the stream still ends with its last chunk and ``[DONE]``, the router exits
cleanly afterwards, and nothing listens on its port any more.
"""

from __future__ import annotations

import json
import signal
import time
import uuid
from pathlib import Path

import httpx
import pytest
from fixtures.net import port_accepts
from gateway_fleet import Publisher, World, start_router, start_simulator, wait_ready

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
