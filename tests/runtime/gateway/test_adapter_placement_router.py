"""LoRA placement through a real router and two simulator replicas with the LoRA API: the
``adapter_residency`` scorer keeps an adapter's requests on the replica that loaded it (one
load, not one per replica), residency another router made is learnt from the replica's
heartbeat (Redis, as the worker writes it), the load counters and residency are on the
router's ``/metrics`` and in its live fleet view."""

from __future__ import annotations

import json
import re
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
import redis
from fixtures.router import redis_url
from fixtures.wait import eventually
from gateway_fleet import (
    Process,
    Publisher,
    World,
    adapter_folder,
    http_get,
    start_router,
    start_simulator,
)
from gateway_fleet import wait_ready as router_ready

from runtime.contract import endpoint_heartbeat_key

pytestmark = pytest.mark.integration

BASE = "lora2-base"
HI = [{"role": "user", "content": "hi"}]
E1, E2 = 36001, 36002  # endpoint ids no other test's heartbeat uses


def loaded(sim: Process) -> set[str]:
    body = json.loads(http_get(f"{sim.base_url}/v1/models")[1])
    return {m["id"] for m in body["data"] if m.get("parent")}


def metric(router: Process, name: str, endpoint: int) -> float:
    text = http_get(f"{router.base_url}/metrics")[1].decode()
    found = re.search(rf'^{name}{{endpoint="{endpoint}"}} ([0-9.e+]+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else -1.0


@pytest.fixture(scope="module")
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[Process, list[Process], str, Path]]:
    publisher = Publisher(f"switchyard:test:lora2:{uuid.uuid4().hex[:12]}")
    root = tmp_path_factory.mktemp("adapters2")
    beats = redis.Redis.from_url(redis_url())
    started: list[Process] = []
    try:
        sims = [start_simulator(BASE, "--max-loras", "2", "--lora-load-ms", "20") for _ in "ab"]
        started.extend(sims)
        world = World()
        world.add_tenant("acme")
        world.add_key("good", "acme")
        world.add_model(BASE, 1)
        for vid, name in enumerate(("a", "b"), start=2):
            uri, digest = adapter_folder(root, name)
            world.add_adapter(
                f"{BASE}-{name}", vid, base_version=1, artifact_uri=uri, digest=digest, label="v1"
            )
        world.add_endpoint(E1, 1, sims[0].base_url)
        world.add_endpoint(E2, 1, sims[1].base_url)
        version = publisher.publish(world.snapshot())
        router = start_router(publisher.prefix, tmp_path_factory.mktemp("lora2-var"))
        started.append(router)
        router_ready(router, version)
        yield router, sims, world.secrets["good"], root
    finally:
        for process in reversed(started):
            process.stop()
        beats.delete(endpoint_heartbeat_key(E1), endpoint_heartbeat_key(E2))
        beats.close()
        publisher.cleanup()


def test_heartbeat_residency_then_one_load_per_adapter(fleet) -> None:
    router, (sim1, sim2), key, root = fleet
    # Another router loaded b on replica 2; the replica's worker reports it in its heartbeat.
    body = json.dumps({"lora_name": f"{BASE}-b@v1", "lora_path": str(root / "b")}).encode()
    request = urllib.request.Request(
        f"{sim2.base_url}/v1/load_lora_adapter", data=body,
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=5) as response:
        assert response.status == 200
    beats = redis.Redis.from_url(redis_url())
    try:
        for eid, adapters in ((E1, []), (E2, [f"{BASE}-b@v1"])):
            value = {"endpoint": eid, "state": "ready", "adapters": adapters}
            beats.set(endpoint_heartbeat_key(eid), json.dumps(value), px=60_000)
    finally:
        beats.close()
    eventually(lambda: metric(router, "switchyard_adapter_resident", E2) == 1, timeout=10,
               what="the router reads replica 2's heartbeat")  # fmt: skip

    client = openai.OpenAI(base_url=f"{router.base_url}/v1", api_key=key, max_retries=0, timeout=30)
    for _ in range(3):
        answer = client.chat.completions.create(model=f"{BASE}-b", messages=HI, max_tokens=2)
        assert answer.model == f"{BASE}-b@v1"
    assert f"{BASE}-b@v1" not in loaded(sim1)  # sent where it was resident: never loaded
    assert metric(router, "switchyard_adapter_loads_total", E1) <= 0
    assert metric(router, "switchyard_adapter_loads_total", E2) <= 0

    for _ in range(4):  # idle replicas: a blind router would alternate and load a on both
        answer = client.chat.completions.create(model=f"{BASE}-a", messages=HI, max_tokens=2)
        assert answer.model == f"{BASE}-a@v1"
    holders = [sim for sim in (sim1, sim2) if f"{BASE}-a@v1" in loaded(sim)]
    assert len(holders) == 1
    loads = [metric(router, "switchyard_adapter_loads_total", eid) for eid in (E1, E2)]
    assert sum(max(x, 0.0) for x in loads) == 1.0  # one load in all
    holder = E1 if holders[0] is sim1 else E2
    assert metric(router, "switchyard_adapter_load_seconds_count", holder) == 1
    assert metric(router, "switchyard_adapter_hits_total", holder) >= 3
