"""Prefix-aware routing through a real router process over simulator engines (issue #35).

Two pools of two simulated engines each: ``on`` (the default: prefix routing on) and ``off``
(pool policy ``prefix_routing: off``). Which engine served a request is read from the
engines' own ``vllm:prompt_tokens_total`` counters. With the policy on, two requests sharing a
long system prompt land on the same engine (and the second hits that engine's prefix cache);
with it off, the pool's load scorer spreads them (ties go round-robin); when the engine
holding the prefix is saturated (its one slot taken by a long stream), the next request with
that prefix goes to the other engine once it has held for a slot there ``prefix_hold_ms``
(250 ms by default).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fixtures.router import Process, World, http_get, metric_value, routers, start_simulator
from integration_support import set_policies, tenant_limits

pytestmark = pytest.mark.integration

ON, OFF = "pfx-on", "pfx-off"
SYSTEM = "You are the support assistant of a large hardware store. " * 40  # ~2,300 chars


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, list[Process]]]:
    started: dict[str, list[Process]] = {ON: [], OFF: []}
    try:
        for model in (ON, OFF):
            for _ in range(2):
                started[model].append(start_simulator(model, "--decode-a-ms", "20"))
        yield started
    finally:
        for sims in started.values():
            for sim in sims:
                sim.stop()


def world_for(engines: dict[str, list[Process]]) -> World:
    world = World()
    for version, model in enumerate((ON, OFF), start=1):
        world.add_model(model, version)
        for index, sim in enumerate(engines[model]):
            world.add_endpoint(version * 10 + index, version, sim.base_url, pool=model,
                               capacity=1)  # fmt: skip
    set_policies(world, OFF, prefix_routing="off")
    world.add_tenant("t", tenant_limits=tenant_limits())
    world.add_key("t", "t")
    return world


def served(sims: list[Process]) -> list[float]:
    """Each engine's prompt tokens so far (grows on the engine that served a request)."""
    counts: list[float] = []
    for sim in sims:
        status, body = http_get(f"{sim.base_url}/metrics")
        assert status == 200
        counts.append(metric_value(body.decode(), "vllm:prompt_tokens_total") or 0.0)
    return counts


def body(model: str, question: str, *, max_tokens: int = 4, stream: bool = False) -> dict:
    return {
        "model": model,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "stream": stream,
    }


def engine_of(http: httpx.Client, sims: list[Process], payload: dict) -> int:
    """Send ``payload`` (unary) and say which engine's counter moved."""
    before = served(sims)
    response = http.post("/v1/chat/completions", json=payload)
    assert response.status_code == 200, response.text
    after = served(sims)
    moved = [i for i, (b, a) in enumerate(zip(before, after, strict=True)) if a > b]
    assert len(moved) == 1, (before, after)
    return moved[0]


def prefix_hits(sim: Process) -> float:
    status, body_ = http_get(f"{sim.base_url}/metrics")
    assert status == 200
    return metric_value(body_.decode(), "vllm:prefix_cache_hits_total") or 0.0


@pytest.mark.timing
def test_shared_prefixes_stick_to_one_engine_until_it_is_saturated(
    engines: dict[str, list[Process]], tmp_path: Path
) -> None:
    world = world_for(engines)
    headers = {"Authorization": f"Bearer {world.secrets['t']}"}
    with routers(world, tmp_path, count=1) as (pair, _):
        base = pair[0].base_url
        with httpx.Client(base_url=base, headers=headers, timeout=30) as http:
            # Off: the load scorer spreads two requests that share the system prompt.
            off = engines[OFF]
            assert {engine_of(http, off, body(OFF, q)) for q in ("one", "two")} == {0, 1}

            # On (the default): the second request follows the first to its engine.
            on = engines[ON]
            first = engine_of(http, on, body(ON, "Where are the hammers?"))
            hits = prefix_hits(on[first])
            assert engine_of(http, on, body(ON, "Do you sell nails?")) == first
            assert prefix_hits(on[first]) > hits  # the engine reused the cached prompt
            assert engine_of(http, on, body(ON, "And screws?")) == first

            # Saturated: a long stream holds the engine's one slot; the next request moves
            # (after holding 250 ms for that slot: the stream takes seconds).
            long_stream = body(ON, "Tell me a story.", max_tokens=400, stream=True)
            with http.stream("POST", "/v1/chat/completions", json=long_stream) as stream:
                assert stream.status_code == 200
                lines = stream.iter_lines()
                next(line for line in lines if line.startswith("data: "))
                assert engine_of(http, on, body(ON, "Is the store open?")) == 1 - first


def test_a_pool_policy_sets_the_sticky_rule(
    engines: dict[str, list[Process]], tmp_path: Path
) -> None:
    """``prefix_min_saved_tokens`` above the shared prompt: the second request no longer
    follows the first, the load scorer spreads them as with prefix routing off."""
    world = world_for(engines)
    set_policies(world, ON, prefix_min_saved_tokens="100000")
    headers = {"Authorization": f"Bearer {world.secrets['t']}"}
    with (
        routers(world, tmp_path, count=1) as (pair, _),
        httpx.Client(base_url=pair[0].base_url, headers=headers, timeout=30) as http,
    ):
        on = engines[ON]
        first = engine_of(http, on, body(ON, "Where are the drills?"))
        assert engine_of(http, on, body(ON, "Do you sell saws?")) == 1 - first
