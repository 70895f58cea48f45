"""Fixtures for rollouts: a model with two published versions (stable and candidate), each
with a real artifact folder, and ready endpoints served by real simulator processes (the
warm-up verifies the digest and sends its requests to them)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fixtures.control_plane import endpoint_ready
from fixtures.router import Process

from apps.models.models import Endpoint, Model, ModelVersion
from apps.models.services import (
    model_create,
    model_version_create,
    model_version_publish,
    pool_create,
)
from tests.apps.rollouts.support import artifact, start_simulator


@pytest.fixture
def make_version(db: Any, tmp_path: Path) -> Callable[..., ModelVersion]:
    def make(model: Model, label: str, *, publish: bool = True) -> ModelVersion:
        version = model_version_create(
            actor=None,
            model=model,
            label=label,
            runtime="simulator",
            **artifact(tmp_path / "artifacts" / model.name / label),
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


@pytest.fixture(scope="module")
def simulators() -> Iterator[dict[str, Process]]:
    """One simulator per version label (v1, v2), shared by a module's tests."""
    started: dict[str, Process] = {}
    try:
        for label in ("v1", "v2"):
            started[label] = start_simulator()
        yield started
    finally:
        for process in started.values():
            process.stop()


@pytest.fixture
def ready_endpoints(
    llm: Model, stable: ModelVersion, candidate: ModelVersion, simulators: dict[str, Process]
) -> Callable[..., list[Any]]:
    """Register a ready endpoint (a real simulator) for each given version."""
    pool = pool_create(actor=None, name="cpu", hardware_tier="cpu", cost_per_replica_hour="1")

    def make(*versions: ModelVersion) -> list[Endpoint]:
        return [
            endpoint_ready(pool, version, simulators[version.label].base_url, capacity=4)
            for version in versions or (stable, candidate)
        ]

    return make
