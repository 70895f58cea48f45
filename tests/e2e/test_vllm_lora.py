"""Real vLLM CPU serves a peft-made LoRA adapter on the demo model, loaded at run time.

The shared session engine (tests/fixtures/vllm_engine.py) runs with ``--enable-lora``; the
worker's :class:`~runtime.workers.adapter_loader.AdapterLoader` verifies the adapter's digest,
loads it once (the second request and concurrent first requests do not load it again), and the
openai client gets different greedy outputs for the base and the adapter (seeded, non-zero B).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import urllib.request
from pathlib import Path

import aiohttp
import openai
import pytest

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
                                   AdapterSlots(max_loras=2, min_residency_s=0))  # fmt: skip
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
