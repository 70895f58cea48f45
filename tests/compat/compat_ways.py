"""The compatibility suite's fixtures (conftest.py re-exports them): the session's real vLLM CPU
engine, a router in front of it, and an openai client for each way in (direct to the engine,
and through the router).

The router is a real ``python -m runtime.gateway`` process reading a hand-built snapshot: one
tenant with one key, the demo model with one version, one endpoint (the engine), capacity 8.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
import openai
import pytest
from fixtures.router import Process, Publisher, World, limits, start_router, wait_ready
from fixtures.vllm_engine import VllmEngine

MODEL = "demo-llama"


@dataclass(frozen=True)
class Ways:
    """The same engine reached two ways."""

    engine: VllmEngine
    router: Process
    key: str

    @property
    def direct_url(self) -> str:
        return self.engine.openai_base_url

    @property
    def routed_url(self) -> str:
        return f"{self.router.base_url}/v1"


def compat_world(engine: VllmEngine) -> tuple[World, str]:
    world = World()
    world.add_tenant("acme", tenant_limits=limits(max_context=4096, max_output=2048))
    key = world.add_key("compat", "acme")
    world.add_model(MODEL, 1)
    artifact = engine.artifact
    world.versions[1] = msgspec.structs.replace(
        world.versions[1],
        artifact_uri=artifact.uri,
        digest=artifact.digest,
        runtime="vllm",
        max_context=artifact.spec.max_context,
        tokenizer=str(artifact.path),
    )
    world.add_endpoint(1, 1, engine.base_url, state="ready", pool="cpu", capacity=8)
    return world, key


@pytest.fixture(scope="session")
def ways(vllm_demo_engine: VllmEngine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Ways]:
    publisher = Publisher(f"switchyard:test:compat:{uuid.uuid4().hex[:12]}")
    router: Process | None = None
    try:
        world, key = compat_world(vllm_demo_engine)
        version = publisher.publish(world.snapshot())
        router = start_router(publisher.prefix, tmp_path_factory.mktemp("compat-router-var"))
        wait_ready(router, version)
        yield Ways(engine=vllm_demo_engine, router=router, key=key)
    finally:
        if router is not None:
            router.stop()
        publisher.cleanup()


@pytest.fixture(scope="session")
def direct(ways: Ways) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(
        base_url=ways.direct_url, api_key="unused", max_retries=0, timeout=120
    ) as client:
        yield client


@pytest.fixture(scope="session")
def routed(ways: Ways) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=ways.routed_url, api_key=ways.key, max_retries=0, timeout=120) as (
        client
    ):
        yield client
