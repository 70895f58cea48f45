"""The registry REST API writes LoRA adapters (a version's base_version) with field errors."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runtime.artifacts import manifest_digest
from tests.api.conftest import World, manifest

pytestmark = pytest.mark.db

OPS = "/api/v1/ops"


def test_adapter_versions_round_trip_with_field_errors(
    world: World, staff_client: APIClient
) -> None:
    base_model = staff_client.post(f"{OPS}/models/", {"name": "llm", "task": "chat"}, format="json")
    lora = staff_client.post(f"{OPS}/models/", {"name": "llm-lora", "task": "chat"}, format="json")
    body = {
        "label": "v1", "artifact_uri": "file:///models/llm/v1",
        "digest": manifest_digest(manifest()["files"]), "manifest": manifest(), "runtime": "vllm",
    }  # fmt: skip
    base = staff_client.post(
        f"{OPS}/models/{base_model.json()['id']}/versions/", body, format="json"
    )
    assert base.status_code == 201
    assert base.json()["base_version"] is None
    url = f"{OPS}/models/{lora.json()['id']}/versions/"
    ghost = staff_client.post(url, {**body, "base_version": 999_999}, format="json")
    assert ghost.status_code == 400
    assert list(ghost.json()["error"]["fields"]) == ["base_version"]
    wrong = staff_client.post(
        url, {**body, "runtime": "simulator", "base_version": base.json()["id"]}, format="json"
    )
    assert wrong.json()["error"]["fields"] == {
        "base_version": ["The adapter's runtime 'simulator' differs from its base's 'vllm'."]
    }
    adapter = staff_client.post(url, {**body, "base_version": base.json()["id"]}, format="json")
    assert adapter.status_code == 201
    assert adapter.json()["base_version"] == base.json()["id"]
    early = staff_client.post(f"{OPS}/versions/{adapter.json()['id']}/publish/")
    assert early.status_code == 400
    assert early.json()["error"]["fields"] == {
        "base_version": ["Publish the base version llm:v1 first."]
    }
