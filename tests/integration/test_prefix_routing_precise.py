"""Precise prefix routing through a real router process: the engines' KV events change the
choice (issue #35, must-have 3).

Two simulated engines publish their prefix caches' KV events (``--kv-events-endpoint``) and
announce them in the snapshot (``EndpointSnap.kv_events``); the router subscribes. A request
with a long system prompt lands on one engine and the next one follows it there (sticky). Then
that engine's cache is reset (``AllBlocksCleared``) while it runs a long stream (one of its two
slots: not saturated). Approximate scoring would still believe it holds the prompt and keep the
next request there; with its events the router knows it holds nothing, and routes by load to
the idle engine.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import zmq
from fixtures.net import free_port
from fixtures.router import Process, World, routers, start_simulator
from fixtures.wait import eventually
from integration_support import tenant_limits
from test_prefix_routing import body, engine_of

from runtime.routing.kv_events import AllCleared, decode_frames

pytestmark = pytest.mark.integration

MODEL = "pfx-kv"


@pytest.fixture(scope="module")
def engines() -> Iterator[list[tuple[Process, str]]]:
    started: list[tuple[Process, str]] = []
    try:
        for _ in range(2):
            events = f"tcp://127.0.0.1:{free_port()}"
            sim = start_simulator(
                MODEL, "--decode-a-ms", "20", "--kv-events-endpoint", events, "--max-num-seqs", "2"
            )
            started.append((sim, events))
        yield started
    finally:
        for sim, _ in started:
            sim.stop()


def _cleared_seen(sub: zmq.Socket) -> bool:
    while sub.poll(0):
        if any(isinstance(e, AllCleared) for e in decode_frames(sub.recv_multipart()).events):
            return True
    return False


@pytest.mark.timing
def test_a_reset_cache_seen_in_the_events_routes_by_load(
    engines: list[tuple[Process, str]], tmp_path: Path
) -> None:
    world = World()
    world.add_model(MODEL, 1)
    for index, (sim, events) in enumerate(engines):
        world.add_endpoint(10 + index, 1, sim.base_url, pool=MODEL, capacity=2, kv_events=events)
    world.add_tenant("t", tenant_limits=tenant_limits())
    world.add_key("t", "t")
    sims = [sim for sim, _ in engines]
    headers = {"Authorization": f"Bearer {world.secrets['t']}"}
    context = zmq.Context()
    with (
        routers(world, tmp_path, count=1) as (pair, _),
        context.socket(zmq.SUB) as watch,
        httpx.Client(base_url=pair[0].base_url, headers=headers, timeout=30) as http,
    ):
        first = engine_of(http, sims, body(MODEL, "Where are the hammers?"))
        assert engine_of(http, sims, body(MODEL, "Do you sell nails?")) == first

        watch.setsockopt(zmq.SUBSCRIBE, b"")
        watch.connect(engines[first][1])
        long_stream = body(MODEL, "Tell me a story.", max_tokens=400, stream=True)
        with http.stream("POST", "/v1/chat/completions", json=long_stream) as stream:
            assert stream.status_code == 200
            next(line for line in stream.iter_lines() if line.startswith("data: "))

            def reset_and_seen() -> bool:  # resent until this subscriber is connected
                reset = httpx.post(f"{sims[first].base_url}/reset_prefix_cache", timeout=5)
                assert reset.status_code == 200
                return _cleared_seen(watch)

            eventually(reset_and_seen, timeout=10, interval=0.2, what="AllBlocksCleared")
            assert engine_of(http, sims, body(MODEL, "Is the store open?")) == 1 - first
    context.term()
