"""Real vLLM CPU serves a peft-made LoRA adapter on the demo model, loaded at run time.

The shared session engine (tests/fixtures/vllm_engine.py) runs with ``--enable-lora``; the
worker's :class:`~runtime.workers.adapter_loader.AdapterLoader` verifies the adapter's digest,
loads it once (the second request and concurrent first requests do not load it again), and the
openai client gets different greedy outputs for the base and the adapter (seeded, non-zero B).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import urllib.request
import uuid
from pathlib import Path

import aiohttp
import openai
import pytest
from fixtures.router import Publisher, start_router, wait_ready
from test_router_vllm import demo_world

from apps.models.demo_adapter import AdapterSpec, generate_demo_adapter
from runtime.routing.adapters import LoadFailedError
from runtime.workers.adapter_loader import AdapterArtifact, AdapterLoader
from runtime.workers.adapters import AdapterSlots

pytestmark = pytest.mark.e2e

PROMPT = "The switchyard routes"


def _adapter(base: Path, out: Path, seed: int) -> AdapterArtifact:
    made = generate_demo_adapter(out, base_dir=base, spec=AdapterSpec(seed=seed))
    return AdapterArtifact(name=f"demo-llama-lora-{seed}@v1", path=made.path,
                           digest=made.digest, files=made.files)  # fmt: skip


def _greedy(client: openai.OpenAI, model: str) -> str:
    result = client.completions.create(model=model, prompt=PROMPT, max_tokens=12, temperature=0.0)
    return result.choices[0].text


def _unload(base_url: str, name: str) -> None:
    body = json.dumps({"lora_name": name}).encode()
    request = urllib.request.Request(
        f"{base_url}/v1/unload_lora_adapter", data=body, method="POST",
        headers={"content-type": "application/json"},
    )  # fmt: skip
    with urllib.request.urlopen(request, timeout=60) as response:
        assert response.status == 200


def test_adapter_loads_once_and_changes_the_output(vllm_demo_engine, tmp_path):
    base = vllm_demo_engine.artifact.path
    one, two = _adapter(base, tmp_path / "a1", 1), _adapter(base, tmp_path / "a2", 2)
    tampered_dir = tmp_path / "bad"
    shutil.copytree(one.path, tampered_dir)
    (tampered_dir / "adapter_config.json").write_text("{}", encoding="utf-8")
    tampered = AdapterArtifact(name="tampered@v1", path=tampered_dir, digest=one.digest,
                               files=one.files)  # fmt: skip

    async def scenario() -> AdapterLoader:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as session:
            loader = AdapterLoader(vllm_demo_engine.base_url, session,
                                   AdapterSlots(capacity=2, min_residency_s=0))  # fmt: skip
            assert await loader.ensure(one) is True
            assert await loader.ensure(one) is False  # resident: not loaded again
            ran = await asyncio.gather(*(loader.ensure(two) for _ in range(3)))
            assert sorted(ran) == [False, False, True]  # concurrent first requests: one load
            with pytest.raises(LoadFailedError, match=r"adapter_config\.json"):
                await loader.ensure(tampered)  # refused before the engine sees it
            return loader

    loader = asyncio.run(scenario())
    assert (loader.stats.loads, loader.stats.hits, loader.stats.waited) == (2, 1, 2)
    assert 0 < loader.stats.last_load_s < 30
    with openai.OpenAI(base_url=vllm_demo_engine.openai_base_url, api_key="unused",
                       max_retries=0, timeout=120) as client:  # fmt: skip
        listed = {m.id: m.model_extra.get("parent") for m in client.models.list().data}
        assert listed[one.name] == "demo-llama"
        assert listed[two.name] == "demo-llama"
        base_out = _greedy(client, "demo-llama")
        assert _greedy(client, one.name) != base_out
        assert _greedy(client, two.name) != base_out
    for name in (one.name, two.name):  # leave the shared engine as it was
        _unload(vllm_demo_engine.base_url, name)


def test_through_the_router_an_adapter_is_loaded_on_first_use(vllm_demo_engine, tmp_path):
    """The router's ``adapter`` stage loads the adapter into the engine on the first request
    (its digest checked) and serves the next from the resident copy; ``parent`` is listed."""
    made = generate_demo_adapter(tmp_path / "a3", base_dir=vllm_demo_engine.artifact.path,
                                 spec=AdapterSpec(seed=3))  # fmt: skip
    world, key = demo_world(vllm_demo_engine)
    world.add_adapter("demo-llama-lora-3", 2, base_version=1, label="v1",
                      artifact_uri=made.uri, digest=made.digest)  # fmt: skip
    publisher = Publisher(f"switchyard:test:e2e-lora:{uuid.uuid4().hex[:12]}")
    router = None
    try:
        version = publisher.publish(world.snapshot())
        router = start_router(publisher.prefix, tmp_path / "router-var")
        wait_ready(router, version)
        with openai.OpenAI(base_url=f"{router.base_url}/v1", api_key=key, max_retries=0,
                           timeout=120) as client:  # fmt: skip
            listed = {m.id: m.model_extra.get("parent") for m in client.models.list().data}
            assert listed["demo-llama-lora-3"] == "demo-llama"
            base_out = _greedy(client, "demo-llama")
            first = client.completions.create(
                model="demo-llama-lora-3", prompt=PROMPT, max_tokens=12, temperature=0.0
            )
            assert first.model == "demo-llama-lora-3@v1"
            assert first.choices[0].text != base_out
            second = _greedy(client, "demo-llama-lora-3")  # resident: no second load
            assert second == first.choices[0].text
        engine_models = json.loads(urllib.request.urlopen(
            f"{vllm_demo_engine.base_url}/v1/models", timeout=30).read())  # fmt: skip
        loaded = [m["id"] for m in engine_models["data"] if m.get("parent") == "demo-llama"]
        assert loaded == ["demo-llama-lora-3@v1"], router.tail()
    finally:
        if router is not None:
            router.stop()
        publisher.cleanup()
        with contextlib.suppress(OSError):
            _unload(vllm_demo_engine.base_url, "demo-llama-lora-3@v1")
