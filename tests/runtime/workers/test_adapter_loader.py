"""A replica's adapter manager against the simulator's LoRA API (runtime.workers.adapter_loader
+ runtime.workers.simulator.lora): verified loads, LRU eviction with minimum residency, single
flight, the refusals a router answers 503 / 429."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import openai
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestServer

from runtime.artifacts import write_manifest
from runtime.routing.adapters import AdapterSignal, LoadFailedError
from runtime.signing import generate_private_key, public_key_text, sign_digest
from runtime.snapshot import SigningSnap
from runtime.testing.snapshots import SnapshotBuilder
from runtime.workers.adapter_loader import (
    AdapterArtifact,
    AdapterFleet,
    AdapterLoader,
    AllSlotsPinnedError,
)
from runtime.workers.adapters import AdapterSlots
from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.server import LORAS, create_app
from runtime.workers.simulator.timing import TimingModel

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

MODEL = "sim-llama"


@pytest_asyncio.fixture
async def sim():
    config = SimulatorConfig(
        model=MODEL, timing=TimingModel(prefill_tps=1e6, decode_a_ms=1, decode_b_ms=0),
        max_loras=2, lora_load_ms=30,
    )  # fmt: skip
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    yield server
    await server.close()


def artifact(tmp_path: Path, name: str) -> AdapterArtifact:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(f'{{"name": "{name}"}}', encoding="utf-8")
    digest, files = write_manifest(folder)
    return AdapterArtifact(name=f"{name}@v1", path=folder, digest=digest, files=files)


async def test_lru_eviction_residency_single_flight_and_refusals(sim, tmp_path):
    url = f"http://127.0.0.1:{sim.port}"
    a, b, c = (artifact(tmp_path, n) for n in ("a", "b", "c"))
    async with aiohttp.ClientSession() as session:
        now = [0.0]  # the residency clock, moved by hand
        loader = AdapterLoader(url, session, AdapterSlots(capacity=2, min_residency_s=0.3),
                               clock=lambda: now[0])  # fmt: skip
        ran = await asyncio.gather(*(loader.ensure(a) for _ in range(4)))
        assert sorted(ran) == [False, False, False, True]  # one load for four first requests
        assert await loader.ensure(b) is True
        with pytest.raises(AllSlotsPinnedError) as pinned:  # a and b are younger than 0.3 s
            await loader.ensure(c)
        assert 0 < pinned.value.retry_after_s <= 0.3
        now[0] += 0.35  # the residency passes
        assert await loader.ensure(b) is False  # a hit: b is now the most recently used
        assert await loader.ensure(c) is True  # evicts a, the least recently used
        assert loader.slots.resident() == ("b@v1", "c@v1")
        assert set(sim.app[LORAS].loaded) == {"b@v1", "c@v1"}
        assert (loader.stats.loads, loader.stats.evictions, loader.stats.waited) == (3, 1, 3)
        assert loader.stats.last_load_s >= 0.03

        (c.path / "adapter_config.json").write_text("{}", encoding="utf-8")
        stale = AdapterArtifact(name="c@v2", path=c.path, digest=c.digest, files=c.files)
        with pytest.raises(LoadFailedError, match=r"adapter_config\.json") as refused:
            await loader.ensure(stale)
        assert refused.value.retry_after_s > 0  # cooled down: not retried at once
        missing = AdapterArtifact(name="gone@v1", path=tmp_path / "gone", digest=c.digest)
        with pytest.raises(LoadFailedError, match="does not exist"):
            await loader.ensure(missing)

    async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0) as client:
        listed = {m.id: m.model_extra.get("parent") for m in (await client.models.list()).data}
        assert listed == {MODEL: None, "b@v1": MODEL, "c@v1": MODEL}
        done = await client.completions.create(model="c@v1", prompt="hi", max_tokens=2)
        assert done.model == "c@v1"
        with pytest.raises(openai.NotFoundError):
            await client.completions.create(model="a@v1", prompt="hi", max_tokens=2)


async def test_fleet_checks_signatures_learns_heartbeats_and_counts(sim, tmp_path):
    """The router's residency book: a router-triggered load is refused unsigned or badly signed
    when signatures are required and loads when signed by a trusted key; a replica's heartbeat
    adds residency; an adapter another router loaded first is resident, not an error."""
    url = f"http://127.0.0.1:{sim.port}"
    key = generate_private_key()[0]
    a, b = artifact(tmp_path, "a"), artifact(tmp_path, "b")
    snapshot = (
        SnapshotBuilder().add_model(MODEL, 1)
        .add_adapter("a", 2, base_version=1, artifact_uri=a.path.as_uri(), digest=a.digest,
                     label="v1")
        .add_adapter("b", 3, base_version=1, artifact_uri=b.path.as_uri(), digest=b.digest,
                     label="v1", signature=sign_digest(key, b.digest), signing_key="release")
        .add_pool("cpu", policies={"max_loras": "1", "max_cpu_loras": "2"})
        .add_endpoint(7, 1, url).snapshot()
    )  # fmt: skip
    endpoint, fleet = snapshot.endpoints[7], AdapterFleet(min_residency_s=0)
    settings = fleet.settings(snapshot, "cpu")
    assert (settings.max_loras, settings.max_cpu_loras) == (1, 2)
    required = SigningSnap(required=True, trusted={"release": public_key_text(key)})
    with pytest.raises(LoadFailedError, match="not signed and artifact signatures are required"):
        await fleet.ensure(endpoint, snapshot.versions[2], settings=settings, signing=required)
    untrusted = SigningSnap(required=True, trusted={})
    with pytest.raises(LoadFailedError, match="release"):
        await fleet.ensure(endpoint, snapshot.versions[3], settings=settings, signing=untrusted)
    assert sim.app[LORAS].loaded == {}  # nothing reached the engine
    fleet = AdapterFleet(min_residency_s=0)  # a fresh book: the failures above cool down
    assert await fleet.ensure(endpoint, snapshot.versions[3], settings=settings, signing=required)
    assert fleet.adapter_signal(7, "b@v1") == AdapterSignal(
        resident=True, load_s=fleet.loader(endpoint).stats.last_load_s
    )

    # a was loaded by another router; the heartbeat says so, then a load is not needed
    await sim.app[LORAS].load("a@v1", str(a.path))
    assert fleet.adapter_signal(8, "a@v1") == AdapterSignal(resident=False)
    fleet.observe(7, frozenset({"a@v1", "b@v1"}))
    fleet.observe(8, frozenset({"a@v1"}))
    assert fleet.adapter_signal(8, "a@v1").resident  # known from its heartbeat alone
    assert fleet.resident() == {7: ("a@v1", "b@v1"), 8: ("a@v1",)}
    assert await fleet.ensure(endpoint, snapshot.versions[2], settings=settings) is False
    loader = fleet.loader(endpoint, settings)
    loader.begin("a@v1")
    assert fleet.adapter_signal(7, "a@v1").active == 1
    assert fleet.adapter_signal(7, "c@v1").batch_full  # max_loras 1, and a is in the batch
    loader.end("a@v1")
    assert not fleet.adapter_signal(7, "c@v1").batch_full
    row = {r.endpoint: r for r in fleet.rows()}[7]
    assert (row.loads, row.hits, row.resident, row.active) == (1, 1, 2, 0)
    fleet.forget(frozenset({7}))
    assert set(fleet.resident()) == {7}

    # another router loaded it between the heartbeat and this load: vLLM's 400 is a success
    fresh = AdapterFleet(min_residency_s=0)
    assert await fresh.ensure(endpoint, snapshot.versions[2]) is True
    assert "a@v1" in fresh.loader(endpoint).slots
