"""Fixtures for the registry: valid version values, factories, snapshot-publish tracking."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from apps.models.models import Model, ModelVersion, Pool
from apps.models.services import (
    model_create,
    model_version_create,
    model_version_publish,
    pool_create,
)
from runtime.artifacts import manifest_digest


def valid_manifest() -> dict[str, Any]:
    return {
        "tokenizer": "hf-internal-testing/llama-tokenizer",
        "max_context": 2048,
        "default_sampling": {"temperature": 0.7, "top_p": 0.95},
        "files": {"model.safetensors": "cd" * 32, "tokenizer/tokenizer.json": "ef" * 32},
    }


@pytest.fixture
def manifest() -> dict[str, Any]:
    return valid_manifest()


@pytest.fixture
def llm(db: Any) -> Model:
    return model_create(actor=None, name="tiny-llama", task="chat", description="demo")


@pytest.fixture
def make_version(llm: Model) -> Callable[..., ModelVersion]:
    def make(label: str = "v1", *, publish: bool = False, **overrides: Any) -> ModelVersion:
        values: dict[str, Any] = {
            "model": llm,
            "artifact_uri": f"file:///models/tiny-llama/{label}",
            "digest": manifest_digest(valid_manifest()["files"]),
            "manifest": valid_manifest(),
            "runtime": "vllm",
            **overrides,
        }
        version = model_version_create(actor=None, label=label, **values)
        return model_version_publish(actor=None, version=version) if publish else version

    return make


@pytest.fixture
def draft(make_version: Callable[..., ModelVersion]) -> ModelVersion:
    return make_version("draft")


@pytest.fixture
def published(make_version: Callable[..., ModelVersion]) -> ModelVersion:
    return make_version("v1", publish=True)


@pytest.fixture
def pool(db: Any) -> Pool:
    return pool_create(
        actor=None, name="cpu-pool", hardware_tier="cpu", cost_per_replica_hour="0.25",
        min_replicas=0, max_replicas=4, warm_replicas=1, policies={"fairness": "vtc"},
    )  # fmt: skip
