"""Fixtures for rollouts: a model with two published versions (stable and candidate)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from apps.models.models import Endpoint, Model, ModelVersion
from apps.models.services import (
    endpoint_register,
    endpoint_set_state,
    model_create,
    model_version_create,
    model_version_publish,
    pool_create,
)
from runtime.artifacts import manifest_digest

MANIFEST = {
    "tokenizer": "tok",
    "max_context": 2048,
    "default_sampling": {"temperature": 0.7},
    "files": {"model.safetensors": "cd" * 32},
}


@pytest.fixture
def make_version(db: Any) -> Callable[..., ModelVersion]:
    def make(model: Model, label: str, *, publish: bool = True) -> ModelVersion:
        version = model_version_create(
            actor=None,
            model=model,
            label=label,
            artifact_uri=f"file:///models/{model.name}/{label}",
            digest=manifest_digest(MANIFEST["files"]),
            manifest=dict(MANIFEST),
            runtime="vllm",
        )
        return model_version_publish(actor=None, version=version) if publish else version

    return make


@pytest.fixture
def llm(db: Any) -> Model:
    return model_create(actor=None, name="tiny-llama", task="chat")


@pytest.fixture
def stable(llm: Model, make_version: Callable[..., ModelVersion]) -> ModelVersion:
    return make_version(llm, "v1")


@pytest.fixture
def candidate(llm: Model, make_version: Callable[..., ModelVersion]) -> ModelVersion:
    return make_version(llm, "v2")


@pytest.fixture
def ready_endpoints(
    llm: Model, stable: ModelVersion, candidate: ModelVersion
) -> Callable[..., list[Any]]:
    """Register a ready endpoint for each given version (the warmup's precondition)."""
    pool = pool_create(actor=None, name="cpu", hardware_tier="cpu", cost_per_replica_hour="1")

    def make(*versions: ModelVersion) -> list[Endpoint]:
        made = []
        for index, version in enumerate(versions or (stable, candidate)):
            endpoint = endpoint_register(
                actor=None,
                pool=pool,
                version=version,
                base_url=f"http://127.0.0.1:{9000 + version.pk * 10 + index}",
                capacity=4,
            )
            made.append(endpoint_set_state(actor=None, endpoint=endpoint, state="ready"))
        return made

    return make
