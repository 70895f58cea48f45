"""The registry REST API writes fallbacks, aliases and capabilities with field errors."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from runtime.artifacts import manifest_digest
from tests.api.conftest import World, etag_patch, manifest

pytestmark = pytest.mark.db

OPS = "/api/v1/ops"


def test_fallback_members_and_capabilities_round_trip(
    world: World, staff_client: APIClient
) -> None:
    small = staff_client.post(f"{OPS}/models/", {"name": "small", "task": "chat"}, format="json")
    assert small.status_code == 201
    assert small.json()["fallback"] is None
    assert small.json()["members"] == []
    ghost = staff_client.post(
        f"{OPS}/models/", {"name": "big", "task": "chat", "fallback": "ghost"}, format="json"
    )
    assert ghost.status_code == 400
    assert list(ghost.json()["error"]["fields"]) == ["fallback"]
    big = staff_client.post(
        f"{OPS}/models/", {"name": "big", "task": "chat", "fallback": "small"}, format="json"
    )
    assert big.status_code == 201
    assert big.json()["fallback"] == "small"
    cycle = etag_patch(staff_client, f"{OPS}/models/{small.json()['id']}/", {"fallback": "big"})
    assert cycle.status_code == 400
    assert cycle.json()["error"]["fields"] == {
        "fallback": ["Fallbacks must not form a cycle: small -> big -> small."]
    }
    alias = staff_client.post(
        f"{OPS}/models/", {"name": "fam", "task": "chat", "members": ["small", "big"]},
        format="json",
    )  # fmt: skip
    assert alias.status_code == 201
    assert alias.json()["members"] == ["small", "big"]
    unfit = staff_client.post(
        f"{OPS}/models/", {"name": "fam2", "task": "chat", "members": ["fam"]}, format="json"
    )
    assert unfit.json()["error"]["fields"] == {
        "members": ["Members must be models, not aliases: 'fam'."]
    }
    body = {
        "label": "v1", "artifact_uri": "file:///models/small/v1",
        "digest": manifest_digest(manifest()["files"]), "manifest": manifest(),
        "runtime": "vllm", "capabilities": ["tools", "x-ray"],
    }  # fmt: skip
    url = f"{OPS}/models/{small.json()['id']}/versions/"
    refused = staff_client.post(url, body, format="json")
    assert refused.status_code == 400
    assert refused.json()["error"]["fields"]["capabilities"][0].startswith(
        "Unknown capabilities: 'x-ray'"
    )
    created = staff_client.post(url, {**body, "capabilities": ["tools"]}, format="json")
    assert created.status_code == 201
    assert created.json()["capabilities"] == ["tools"]
