"""A tenant's ``zero_retention`` switch: written through REST and the admin, validated, audited,
in the snapshot; switched on, it deletes what Redis kept for the tenant (real Redis)."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.urls import reverse
from rest_framework.test import APIClient

from apps.common.models import AuditEvent
from apps.core.selectors import snapshot_build
from apps.tenants.models import Tenant
from runtime.contract import cache_entry_key, idempotency_key
from tests.api.conftest import LIMITS, World

pytestmark = [pytest.mark.db, pytest.mark.django_db]

OPS = "/api/v1/ops"


def _patch(client: APIClient, url: str, data: dict[str, Any]) -> Any:
    etag = client.get(url)["ETag"]
    return client.patch(url, data, format="json", HTTP_IF_MATCH=etag)


@pytest.fixture
def namespace(settings: Any) -> Iterator[str]:
    ns = f"switchyard:test:zero:{uuid.uuid4().hex[:10]}"
    settings.SNAPSHOT_REDIS_PREFIX = f"{ns}:snapshot"
    yield ns
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    keys = list(client.scan_iter(match=f"{ns}:*"))
    if keys:
        client.delete(*keys)
    client.close()


def test_switched_on_through_rest_it_reaches_the_snapshot_and_forgets_what_was_kept(
    world: World, staff_client: APIClient, namespace: str,
    django_capture_on_commit_callbacks: Callable[..., Any],
) -> None:  # fmt: skip
    client = redis.Redis.from_url(django_settings.REDIS_URL)
    kept = [cache_entry_key(namespace, "acme", "v", "k1"), idempotency_key(namespace, "acme", "d")]
    other = [cache_entry_key(namespace, "globex", "v", "k1"),
             idempotency_key(namespace, "globex", "d")]  # fmt: skip
    for key in (*kept, *other):
        client.set(key, b"SYE1sealed")
    assert snapshot_build().tenants["acme"].zero_retention is False

    with django_capture_on_commit_callbacks(execute=True):
        changed = _patch(staff_client, f"{OPS}/tenants/acme/", {"zero_retention": True})

    assert changed.status_code == 200, changed.content
    assert changed.json()["zero_retention"] is True
    assert snapshot_build().tenants["acme"].zero_retention is True
    assert [client.exists(k) for k in kept] == [0, 0]
    assert [client.exists(k) for k in other] == [1, 1]  # another tenant's entries stay
    event = AuditEvent.objects.filter(action="tenant.update").latest("id")
    assert (event.before, event.after) == ({"zero_retention": False}, {"zero_retention": True})
    client.close()


def test_created_with_zero_retention(world: World, staff_client: APIClient) -> None:
    created = staff_client.post(
        f"{OPS}/tenants/",
        {"slug": "initech", "name": "Initech", **LIMITS, "zero_retention": True},
        format="json",
    )
    assert created.status_code == 201, created.content
    assert snapshot_build().tenants["initech"].zero_retention is True
    assert AuditEvent.objects.get(action="tenant.create", target_id=str(
        Tenant.objects.get(slug="initech").pk)).after["zero_retention"] is True  # fmt: skip


def test_a_non_boolean_is_refused_with_a_field_error(world: World, staff_client: APIClient) -> None:
    refused = _patch(staff_client, f"{OPS}/tenants/acme/", {"zero_retention": "perhaps"})
    assert refused.status_code == 400, refused.content
    assert "zero_retention" in refused.json()["error"]["fields"]
    assert snapshot_build().tenants["acme"].zero_retention is False


def test_the_admin_checkbox_switches_it_on(world: World, admin_client: Any) -> None:
    tenant = Tenant.objects.get(slug="acme")
    url = reverse("admin:tenants_tenant_change", args=[tenant.pk])
    form = {"name": tenant.name, "status": "active", "weight": "1", **LIMITS,
            "max_request_bytes": "0", "result_cache": "on", "zero_retention": "on"}  # fmt: skip
    response = admin_client.post(url, form)
    assert response.status_code == 302, response.content
    assert Tenant.objects.get(pk=tenant.pk).zero_retention is True
