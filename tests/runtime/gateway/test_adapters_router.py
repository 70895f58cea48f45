"""LoRA adapters through a real router and a simulator with the simulator's LoRA API: an
adapter is served by its base's replica, loaded once on first use (concurrent first requests
share the load), listed with ``parent``; the refusals are 404 model_not_found (unknown), 503
adapter_load_failed (bad artifact, with Retry-After), 429 adapter_slots_pinned (every slot
younger than the minimum residency, with Retry-After)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
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

pytestmark = pytest.mark.integration

BASE = "lora-base"
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Process, Process, str]]:
    publisher = Publisher(f"switchyard:test:lora:{uuid.uuid4().hex[:12]}")
    root = tmp_path_factory.mktemp("adapters")
    started: list[Process] = []
    try:
        sim = start_simulator(BASE, "--max-loras", "2", "--lora-load-ms", "100")
        started.append(sim)
        world = World()
        world.add_tenant("acme")
        world.add_key("good", "acme")
        world.add_model(BASE, 1)
        world.add_pool("cpu", policies={"max_loras": "2", "max_cpu_loras": "2"})
        for vid, name in enumerate(("a", "b", "c", "broken"), start=2):
            uri, digest = adapter_folder(root, name)
            digest = "0" * 64 if name == "broken" else digest
            world.add_adapter(
                f"{BASE}-{name}", vid, base_version=1, artifact_uri=uri, digest=digest, label="v1"
            )
        world.add_endpoint(1, 1, sim.base_url)
        version = publisher.publish(world.snapshot())
        router = start_router(publisher.prefix, tmp_path_factory.mktemp("lora-var"))
        started.append(router)
        router_ready(router, version)
        yield router, sim, world.secrets["good"]
    finally:
        for process in reversed(started):
            process.stop()
        publisher.cleanup()


def test_adapters_load_once_are_listed_and_refused_clearly(fleet) -> None:
    router, sim, key = fleet
    client = openai.OpenAI(base_url=f"{router.base_url}/v1", api_key=key, max_retries=0, timeout=30)
    first = client.chat.completions.create(model=f"{BASE}-a", messages=HI, max_tokens=2)
    assert first.model == f"{BASE}-a@v1"  # the engine's name for the adapter version
    with ThreadPoolExecutor(4) as pool:  # concurrent first requests for b: one load
        answers = list(pool.map(lambda _: client.chat.completions.create(
            model=f"{BASE}-b", messages=HI, max_tokens=2), range(4)))  # fmt: skip
    assert {a.model for a in answers} == {f"{BASE}-b@v1"}
    engine = json.loads(http_get(f"{sim.base_url}/v1/models")[1])
    assert {m["id"]: m["parent"] for m in engine["data"]} == {
        BASE: None, f"{BASE}-a@v1": BASE, f"{BASE}-b@v1": BASE,
    }  # fmt: skip
    listed = {m.id: (m.model_extra or {}).get("parent") for m in client.models.list()}
    assert listed[f"{BASE}-a"] == BASE
    assert listed[BASE] is None

    with pytest.raises(openai.RateLimitError) as pinned:  # a and b are both < 30 s resident
        client.chat.completions.create(model=f"{BASE}-c", messages=HI, max_tokens=2)
    assert pinned.value.code == "adapter_slots_pinned"
    assert 1 <= int(pinned.value.response.headers["retry-after"]) <= 30
    with pytest.raises(openai.InternalServerError) as failed:
        client.chat.completions.create(model=f"{BASE}-broken", messages=HI, max_tokens=2)
    assert failed.value.status_code == 503
    assert failed.value.code == "adapter_load_failed"
    assert "does not match expected" in failed.value.message
    assert int(failed.value.response.headers["retry-after"]) >= 1
    with pytest.raises(openai.NotFoundError) as unknown:
        client.chat.completions.create(model=f"{BASE}-zzz", messages=HI, max_tokens=2)
    assert unknown.value.code == "model_not_found"
    again = client.chat.completions.create(model=f"{BASE}-a", messages=HI, max_tokens=2)
    assert again.model == f"{BASE}-a@v1"  # still resident: served without a load
