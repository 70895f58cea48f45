"""A tenant's ``batch_file_retention_days`` (issue #32 item 6): written through REST and the
admin, validated (a whole number of days, at least 1, or null: kept until deleted), audited."""

from __future__ import annotations

from typing import Any

import pytest
from django.urls import reverse
from rest_framework.test import APIClient

from apps.common.models import AuditEvent
from apps.tenants.models import Tenant
from tests.api.conftest import LIMITS, World

pytestmark = [pytest.mark.db, pytest.mark.django_db]

URL = "/api/v1/ops/tenants/acme/"


def _patch(client: APIClient, data: dict[str, Any]) -> Any:
    etag = client.get(URL)["ETag"]
    return client.patch(URL, data, format="json", HTTP_IF_MATCH=etag)


def test_set_and_cleared_through_rest_and_audited(world: World, staff_client: APIClient) -> None:
    assert staff_client.get(URL).json()["batch_file_retention_days"] is None
    changed = _patch(staff_client, {"batch_file_retention_days": 30})
    assert changed.status_code == 200, changed.content
    assert changed.json()["batch_file_retention_days"] == 30
    assert Tenant.objects.get(slug="acme").batch_file_retention_days == 30
    event = AuditEvent.objects.filter(action="tenant.update").latest("id")
    assert event.after == {"batch_file_retention_days": 30}
    cleared = _patch(staff_client, {"batch_file_retention_days": None})
    assert cleared.status_code == 200, cleared.content
    assert Tenant.objects.get(slug="acme").batch_file_retention_days is None


@pytest.mark.parametrize("bad", [0, -3, "soon"])
def test_a_bad_period_is_refused_with_a_field_error(
    world: World, staff_client: APIClient, bad: object
) -> None:
    refused = _patch(staff_client, {"batch_file_retention_days": bad})
    assert refused.status_code == 400, refused.content
    assert "batch_file_retention_days" in refused.json()["error"]["fields"]
    assert Tenant.objects.get(slug="acme").batch_file_retention_days is None


def test_the_admin_form_sets_it(world: World, admin_client: Any) -> None:
    tenant = Tenant.objects.get(slug="acme")
    url = reverse("admin:tenants_tenant_change", args=[tenant.pk])
    form = {"name": tenant.name, "status": "active", "weight": "1", **LIMITS,
            "max_request_bytes": "0", "result_cache": "on",
            "batch_file_retention_days": "14"}  # fmt: skip
    response = admin_client.post(url, form)
    assert response.status_code == 302, response.content
    assert Tenant.objects.get(pk=tenant.pk).batch_file_retention_days == 14
