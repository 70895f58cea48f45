"""Every field the router reads has a write path: the result-cache switches and the request
size cap, written through the operator REST API, reach the snapshot the router loads."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from apps.core.selectors import snapshot_build
from tests.api.conftest import LIMITS, World, patch_if_match

pytestmark = [pytest.mark.db, pytest.mark.django_db]

OPS = "/api/v1/ops"


def test_tenant_result_cache_and_size_cap_reach_the_snapshot(
    world: World, staff_client: APIClient
) -> None:
    before = snapshot_build().tenants["acme"]
    assert (before.result_cache, before.max_request_bytes) == (True, 0)

    changed = patch_if_match(
        staff_client, f"{OPS}/tenants/acme/", {"result_cache": False, "max_request_bytes": 4096}
    )

    assert changed.status_code == 200, changed.content
    assert (changed.json()["result_cache"], changed.json()["max_request_bytes"]) == (False, 4096)
    after = snapshot_build().tenants["acme"]
    assert (after.result_cache, after.max_request_bytes) == (False, 4096)


def test_tenant_created_without_the_result_cache(world: World, staff_client: APIClient) -> None:
    created = staff_client.post(
        f"{OPS}/tenants/",
        {"slug": "initech", "name": "Initech", **LIMITS, "result_cache": False},
        format="json",
    )

    assert created.status_code == 201, created.content
    assert snapshot_build().tenants["initech"].result_cache is False


def test_model_cache_switches_reach_the_snapshot(world: World, staff_client: APIClient) -> None:
    url = f"{OPS}/models/{world.model.pk}/"
    assert snapshot_build().models["tiny-llama"].cache.enabled is True

    changed = patch_if_match(
        staff_client, url, {"cache_enabled": False, "cache_shared": True, "cache_ttl_s": 120}
    )

    assert changed.status_code == 200, changed.content
    body = changed.json()
    assert (body["cache_enabled"], body["cache_shared"], body["cache_ttl_s"]) == (False, True, 120)
    cache = snapshot_build().models["tiny-llama"].cache
    assert (cache.enabled, cache.shared, cache.ttl_s) == (False, True, 120)


def test_model_refused_fields_reach_the_snapshot(world: World, staff_client: APIClient) -> None:
    changed = patch_if_match(
        staff_client, f"{OPS}/models/{world.model.pk}/", {"refused_fields": ["logit_bias"]}
    )

    assert changed.status_code == 200, changed.content
    assert snapshot_build().models["tiny-llama"].refused_fields == ("logit_bias",)


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"cache_ttl_s": 0}, "cache_ttl_s"),
        ({"cache_ttl_s": "soon"}, "cache_ttl_s"),
        ({"cache_enabled": "perhaps"}, "cache_enabled"),
        ({"refused_fields": ["model"]}, "refused_fields"),
    ],
)
def test_model_cache_refusals(
    world: World, staff_client: APIClient, data: dict[str, Any], field: str
) -> None:
    refused = patch_if_match(staff_client, f"{OPS}/models/{world.model.pk}/", data)

    assert refused.status_code == 400, refused.content
    assert field in refused.json()["error"]["fields"]
    cache = snapshot_build().models["tiny-llama"].cache
    assert (cache.enabled, cache.ttl_s) == (True, 3600)


def test_tenant_result_cache_refuses_a_non_boolean(world: World, staff_client: APIClient) -> None:
    refused = patch_if_match(staff_client, f"{OPS}/tenants/acme/", {"result_cache": "perhaps"})

    assert refused.status_code == 400, refused.content
    assert "result_cache" in refused.json()["error"]["fields"]
