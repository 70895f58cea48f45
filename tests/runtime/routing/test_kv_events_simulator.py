"""Precise prefix scoring end to end with simulated engines: two simulator processes started by
the worker launcher with KV events on, the router's subscribers on their ZeroMQ sockets, the
tracker mapping their events onto router blocks, and the choice that follows."""

from __future__ import annotations

import io
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio
from fixtures.net import free_port
from fixtures.wait import async_eventually

from runtime.routing.kv_subscriber import KvEventSubscribers
from runtime.routing.kv_tracker import KvEventTracker
from runtime.routing.prefix import chat_block_hashes
from runtime.routing.prefix_index import PrefixIndex
from runtime.routing.sticky import Candidate, StickyRule, sticky_choice
from runtime.workers.launch import EngineProcess, WorkerSpec, build_command, build_env

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

MODEL = "sim-kv"
SYSTEM_A = "You are the ACME parcel desk. Answer briefly, name the depot. " * 20  # ~1,300 chars
SYSTEM_B = "You are the Globex billing desk; quote the invoice number first. " * 20


class Sim:
    def __init__(self, spec: WorkerSpec, process: EngineProcess) -> None:
        self.spec = spec
        self.process = process

    @property
    def events_url(self) -> str:
        return f"tcp://127.0.0.1:{self.spec.kv_events_port}"


@pytest_asyncio.fixture
async def sims() -> AsyncIterator[list[Sim]]:
    started: list[Sim] = []
    try:
        for _ in range(2):
            spec = WorkerSpec(
                artifact_dir=Path("."),
                expected_digest="",
                served_model_name=MODEL,
                port=free_port(),
                backend="simulator",
                kv_events_port=free_port(),
            )
            argv = [*build_command(spec), "--prefill-tps", "200000", "--log-level", "WARNING"]
            process = await EngineProcess.start(argv, build_env(spec), sink=io.BytesIO())
            started.append(Sim(spec, process))
        async with aiohttp.ClientSession() as session:
            for sim in started:

                async def healthy(sim: Sim = sim) -> bool:
                    async with session.get(f"{sim.spec.base_url}/health") as response:
                        return response.status == 200

                await async_eventually(
                    healthy, timeout=60, ignore=(aiohttp.ClientError,), what="simulator up"
                )
        yield started
    finally:
        for sim in started:
            await sim.process.stop(5.0)


async def _chat(session: aiohttp.ClientSession, sim: Sim, system: str, user: str) -> None:
    body = {
        "model": MODEL,
        "max_tokens": 2,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    }
    async with session.post(f"{sim.spec.base_url}/v1/chat/completions", json=body) as response:
        assert response.status == 200, await response.text()


def _hashes(system: str, user: str) -> tuple[int, ...]:
    return chat_block_hashes([("system", system), ("user", user)])


async def test_events_reach_the_index_and_decide_the_choice(sims: list[Sim]) -> None:
    approximate = PrefixIndex()
    tracker = KvEventTracker(approximate=approximate, stale_s=2.0)
    subscribers = KvEventSubscribers(tracker, heartbeat_s=0.2)
    ids = {1: sims[0], 2: sims[1]}
    subscribers.sync({endpoint_id: sim.events_url for endpoint_id, sim in ids.items()})
    try:
        await async_eventually(
            lambda: all(tracker.sizes().get(e) is not None for e in ids),
            what="both subscribers connected",
        )
        async with aiohttp.ClientSession() as session:
            # The first turns: tenant A's conversation on endpoint 1, tenant B's on 2.
            for endpoint_id, system in ((1, SYSTEM_A), (2, SYSTEM_B)):
                hashes = _hashes(system, "Hello, where is my order?")
                tracker.note_dispatch(endpoint_id, hashes, now=_now())
                await _chat(session, ids[endpoint_id], system, "Hello, where is my order?")
            new_a = _hashes(SYSTEM_A, "A new question from tenant A")
            matched = await async_eventually(
                lambda: _both(tracker.match(new_a, _now(), ids)), what="events of both engines"
            )
            assert matched[1] >= len(SYSTEM_A) // 256 - 1  # the whole system prompt, about
            assert matched.get(2, 0) == 0
            assert tracker.precise(1, _now())
            assert approximate.match(new_a, _now()) == {}  # learned from events alone
            candidates = [
                Candidate(endpoint_id=e, cached_tokens=matched.get(e, 0) * 64,
                          queued_prefill_tokens=0, in_flight=0, capacity=8)
                for e in ids
            ]  # fmt: skip
            assert sticky_choice(candidates, StickyRule()) == 1

            # The engine drops its cache: the router forgets what endpoint 1 held.
            async with session.post(f"{ids[1].spec.base_url}/reset_prefix_cache") as response:
                assert response.status == 200
            await async_eventually(
                lambda: tracker.match(new_a, _now(), [1]) == {}, what="cleared cache seen"
            )

            # Endpoint 2's engine goes away: its socket drops, it falls back to approximate.
            approximate.record(2, new_a, _now())
            await ids[2].process.stop(5.0)
            await async_eventually(
                lambda: not tracker.precise(2, _now()), timeout=15, what="fallback on a drop"
            )
            assert tracker.match(new_a, _now(), [2]) == {2: len(new_a)}
        assert subscribers.bad_messages == {}
        assert subscribers.messages[1] >= 2
    finally:
        await subscribers.close()


def _both(found: dict[int, int]) -> dict[int, int] | None:
    return found if found.get(1) else None


def _now() -> float:
    return time.monotonic()
