"""Real vLLM CPU serves a peft-made LoRA adapter on the demo model, loaded at run time.

The shared session engine (tests/fixtures/vllm_engine.py) runs with ``--enable-lora``; the
worker's :class:`~runtime.workers.adapter_loader.AdapterLoader` verifies the adapter's digest,
loads it once (the second request and concurrent first requests do not load it again), and the
openai client gets different greedy outputs for the base and the adapter (seeded, non-zero B).
Through the router, a pool with one adapter slot evicts the least recently used adapter from
the engine (after its minimum residency) to load the next.
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
from fixtures.router import Publisher, http_get, metric_value, start_router, wait_ready
from fixtures.wait import eventually
from test_router_vllm import demo_world

from apps.models.demo_adapter import AdapterSpec, generate_demo_adapter
from runtime.routing.adapters import LoadFailedError
from runtime.workers.adapter_loader import AdapterArtifact, AdapterLoader
from runtime.workers.adapters import DEFAULT_MIN_RESIDENCY_S, AdapterSlots

pytestmark = pytest.mark.e2e

PROMPT = "The switchyard routes"


def _adapter(base: Path, out: Path, seed: int) -> AdapterArtifact:
    made = generate_demo_adapter(out, base_dir=base, spec=AdapterSpec(seed=seed))
    return AdapterArtifact(name=f"demo-llama-lora-{seed}@v1", path=made.path,
                           digest=made.digest, files=made.files)  # fmt: skip


def _greedy(client: openai.OpenAI, model: str, *, no_store: bool = False) -> str:
    """The greedy completion of PROMPT; ``no_store``: past the router's response cache (a hit
    there would not reach the engine, so it proves nothing about residency)."""
    headers = {"Cache-Control": "no-store"} if no_store else None
    result = client.completions.create(model=model, prompt=PROMPT, max_tokens=12,
                                       temperature=0.0, extra_headers=headers)  # fmt: skip
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
            second = _greedy(client, "demo-llama-lora-3", no_store=True)  # resident: no load
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


def _engine_adapters(base_url: str) -> list[str]:
    """The adapters the engine has loaded (its ``/v1/models`` entries with a parent)."""
    body = json.loads(urllib.request.urlopen(f"{base_url}/v1/models", timeout=30).read())
    return sorted(m["id"] for m in body["data"] if m.get("parent") == "demo-llama")


def _served_once_unpinned(client: openai.OpenAI, model: str) -> str:
    """The adapter's greedy output, asked again while the router answers 429
    ``adapter_slots_pinned`` (the one slot holds an adapter younger than the minimum
    residency, 10 s: on a slow machine it may be older already): bounded by that residency
    and a margin."""

    refusals: list[tuple[str | None, int]] = []

    def attempt() -> str | None:
        try:
            return _greedy(client, model, no_store=True)
        except openai.RateLimitError as exc:
            refusals.append((exc.code, int(exc.response.headers["retry-after"])))
            return None

    out = eventually(attempt, timeout=DEFAULT_MIN_RESIDENCY_S + 20, interval=0.5,
                     what=f"{model} served once its slot can be freed")  # fmt: skip
    for code, retry_after in refusals:
        assert code == "adapter_slots_pinned"
        assert 1 <= retry_after <= DEFAULT_MIN_RESIDENCY_S + 1
    return out


def test_one_adapter_slot_evicts_the_least_recently_used(vllm_demo_engine, tmp_path):
    """A pool whose policies give one adapter slot (``max_loras`` = ``max_cpu_loras`` = 1):
    A is loaded once (the second request is a hit), B waits out A's minimum residency (429)
    then evicts A from the engine, and A evicts B the same way; the router counts each."""
    base = vllm_demo_engine.artifact.path
    world, key = demo_world(vllm_demo_engine)
    world.add_pool("cpu", policies={"max_loras": "1", "max_cpu_loras": "1"})
    names = {}
    for vid, seed in ((2, 4), (3, 5)):
        made = generate_demo_adapter(tmp_path / f"a{seed}", base_dir=base,
                                     spec=AdapterSpec(seed=seed))  # fmt: skip
        world.add_adapter(f"demo-llama-lora-{seed}", vid, base_version=1, label="v1",
                          artifact_uri=made.uri, digest=made.digest)  # fmt: skip
        names[seed] = f"demo-llama-lora-{seed}"
    a, b = names[4], names[5]
    publisher = Publisher(f"switchyard:test:e2e-lora-lru:{uuid.uuid4().hex[:12]}")
    router = None

    def counters() -> tuple[float | None, ...]:
        text = http_get(f"{router.base_url}/metrics")[1].decode()
        return tuple(metric_value(text, f"switchyard_adapter_{n}_total")
                     for n in ("loads", "evictions", "hits"))  # fmt: skip

    try:
        version = publisher.publish(world.snapshot())
        router = start_router(publisher.prefix, tmp_path / "router-var")
        wait_ready(router, version)
        with openai.OpenAI(base_url=f"{router.base_url}/v1", api_key=key, max_retries=0,
                           timeout=120) as client:  # fmt: skip
            base_out = _greedy(client, "demo-llama")
            first_a = _greedy(client, a, no_store=True)
            assert first_a != base_out
            assert _greedy(client, a, no_store=True) == first_a  # resident: a hit, no load
            assert _engine_adapters(vllm_demo_engine.base_url) == [f"{a}@v1"]
            assert counters() == (1, 0, 1), router.tail()
            out_b = _served_once_unpinned(client, b)  # evicts A once A is old enough
            assert out_b not in (base_out, first_a)
            assert _engine_adapters(vllm_demo_engine.base_url) == [f"{b}@v1"]
            assert counters() == (2, 1, 1), router.tail()
            assert _served_once_unpinned(client, a) == first_a  # loaded again, evicting B
            assert _engine_adapters(vllm_demo_engine.base_url) == [f"{a}@v1"]
            assert counters() == (3, 2, 1), router.tail()
    finally:
        if router is not None:
            router.stop()
        publisher.cleanup()
        for name in (a, b):
            with contextlib.suppress(OSError):
                _unload(vllm_demo_engine.base_url, f"{name}@v1")
