"""Resume affinity (issue #34): a preempted stream resumes on the endpoint it ran on.

A real router over two vLLM simulators, one slot each, with ``preemption: fair``. The
flooder's stream ``A`` runs on one endpoint, its stream ``B`` (lent) on the other; a polite
request arrives and takes ``B``'s slot (``B``'s prompt is the shorter: the cheaper to
resume). ``A`` ends
first and frees its endpoint. With ``resume_affinity: on`` and a hold longer than the polite
request, ``B`` waits for its home and resumes there, where the simulator's prefix cache
still holds its prompt (a prefix-cache hit); without it ``B`` resumes at once on ``A``'s
endpoint, which never saw its prompt.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from dataclasses import dataclass

import aiohttp
import pytest
from fixtures.router import (
    Process,
    Publisher,
    World,
    http_get,
    routers,
    start_simulator,
    wait_ready,
)
from fixtures.wait import async_eventually
from integration_support import add_class, set_policies, tenant_limits

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(120)]

MODEL = "affinity-chat"
B_PROMPT = " ".join(["the stream that is stopped and resumed"] * 12)  # ~7 cached blocks
A_PROMPT = " ".join(["a dearer stream to resume, it keeps its slot"] * 24)  # ~2x B's
A_TOKENS, B_TOKENS, POLITE_TOKENS = 40, 30, 60  # at 50 ms a token: A ends before polite


@dataclass
class Fleet:
    router: Process
    sims: dict[int, Process]  # endpoint id -> its simulator
    keys: dict[str, str]
    world: World
    publisher: Publisher

    def policies(self, **policies: str) -> None:
        set_policies(self.world, "p", saturation="inflight_only", preemption="fair", **policies)
        wait_ready(self.router, self.publisher.publish(self.world.snapshot()))

    def router_metric(self, name: str) -> float:
        return _metric(self.router.base_url, name)

    def sim_metric(self, endpoint_id: int, name: str) -> float:
        return _metric(self.sims[endpoint_id].base_url, name)


def _metric(base_url: str, name: str) -> float:
    _status, body = http_get(f"{base_url}/metrics")
    total = 0.0
    for line in body.decode().splitlines():
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] == name:
            total += float(value)
    return total


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    sims = {n: start_simulator(MODEL, "--decode-a-ms", "50", "--max-num-seqs", "4")
            for n in (1, 2)}  # fmt: skip
    try:
        world = World()
        add_class(world, "standard", band=0, deadline_ms=60_000)
        world.add_model(MODEL, 1)
        for endpoint_id, sim in sims.items():
            world.add_endpoint(endpoint_id, 1, sim.base_url, pool="p", capacity=1)
        set_policies(world, "p", saturation="inflight_only", preemption="fair")
        for tenant in ("flooder", "polite"):
            world.add_tenant(tenant, classes=("standard",), default_class="standard",
                             tenant_limits=tenant_limits())  # fmt: skip
            world.add_key(tenant, tenant)
        with routers(world, tmp_path_factory.mktemp("affinity")) as ([router], publisher):
            yield Fleet(router, sims, dict(world.secrets), world, publisher)
    finally:
        for sim in sims.values():
            sim.stop()


async def stream(http: aiohttp.ClientSession, fleet: Fleet, seen: list[int], *, tenant: str,
                 prompt: str, max_tokens: int) -> None:  # fmt: skip
    """Stream a chat completion; ``seen[0]`` counts its content chunks as they arrive."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True, "temperature": 0}  # fmt: skip
    headers = {"Authorization": f"Bearer {fleet.keys[tenant]}"}
    url = f"{fleet.router.base_url}/v1/chat/completions"
    async with http.post(url, json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk, chunk
            seen[0] += sum(1 for ch in chunk.get("choices") or []
                           if (ch.get("delta") or {}).get("content"))  # fmt: skip


async def until(check: object, what: str) -> None:
    await async_eventually(check, timeout=20.0, interval=0.02, what=what)  # type: ignore[arg-type]


def running_on(fleet: Fleet) -> set[int]:
    return {e for e in fleet.sims if fleet.sim_metric(e, "vllm:num_requests_running") > 0}


async def preempt_and_resume(fleet: Fleet, tag: str) -> tuple[int, int, dict[int, float]]:
    """Run the module's scenario; (B's home, A's endpoint, per endpoint the prefix-cache
    hits, in tokens, of the requests after B's first)."""
    a, b, polite = [0], [0], [0]
    preempted = fleet.router_metric("switchyard_preemptions_total")
    async with aiohttp.ClientSession() as http:
        tasks = [asyncio.create_task(stream(http, fleet, a, tenant="flooder",
                                            prompt=f"{tag} {A_PROMPT}",
                                            max_tokens=A_TOKENS))]  # fmt: skip
        await until(lambda: a[0] >= 16, "A streams")
        [a_on] = running_on(fleet)
        tasks.append(asyncio.create_task(stream(http, fleet, b, tenant="flooder",
                                                prompt=f"{tag} {B_PROMPT}",
                                                max_tokens=B_TOKENS)))  # fmt: skip
        await until(lambda: b[0] >= 3, "B streams")
        [home] = set(fleet.sims) - {a_on}
        hits = {e: fleet.sim_metric(e, "vllm:prefix_cache_hits_total") for e in fleet.sims}
        tasks.append(asyncio.create_task(stream(http, fleet, polite, tenant="polite",
                                                prompt=f"{tag} hello",
                                                max_tokens=POLITE_TOKENS)))  # fmt: skip
        await until(lambda: fleet.router_metric("switchyard_preemptions_total") > preempted,
                    "B preempted")  # fmt: skip
        await asyncio.wait_for(asyncio.gather(*tasks), 60)
    assert (a[0], b[0], polite[0]) == (A_TOKENS, B_TOKENS, POLITE_TOKENS)
    after = {e: fleet.sim_metric(e, "vllm:prefix_cache_hits_total") - hits[e] for e in hits}
    return home, a_on, after


async def test_a_preempted_stream_resumes_on_its_home_endpoint_and_hits_its_cache(
    fleet: Fleet,
) -> None:
    fleet.policies(resume_affinity="on", resume_hold_ms="20000")
    try:
        home, a_on, hits = await preempt_and_resume(fleet, "home")
    finally:
        fleet.policies()
    assert hits[home] > 0  # B's resume found its prompt's blocks where it ran
    assert hits[a_on] == 0


async def test_without_affinity_it_resumes_on_the_first_free_endpoint(fleet: Fleet) -> None:
    home, a_on, hits = await preempt_and_resume(fleet, "away")
    assert hits == {home: 0, a_on: 0}  # B resumed on A's endpoint, which never saw its prompt
