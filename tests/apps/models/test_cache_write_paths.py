"""The cache switches through the admin and the services: validated, audited, in the snapshot."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError
from django.urls import reverse

from apps.common.models import AuditEvent
from apps.core.selectors import snapshot_build
from apps.models.models import Model
from apps.models.services import model_create, model_update
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create, tenant_update
from tests.api.conftest import LIMITS

pytestmark = [pytest.mark.db, pytest.mark.django_db]



def _post_model_form(admin_client, model, **switches):
    """The model's admin change form as a browser posts it (unchecked boxes are absent)."""
    url = reverse("admin:registry_model_change", args=[model.pk])
    form = {"name": model.name, "task": model.task, "description": "", "refused_fields": "[]"}
    return admin_client.post(url, {**form, **switches})


def test_model_admin_writes_the_cache_switches(admin_client):
    model = model_create(actor=None, name="m1", task="chat")

    response = _post_model_form(admin_client, model, cache_shared="on", cache_ttl_s="60")

    assert response.status_code == 302, response.content
    model.refresh_from_db()
    assert (model.cache_enabled, model.cache_shared, model.cache_ttl_s) == (False, True, 60)
    event = AuditEvent.objects.filter(action="model.update").latest("id")
    assert event.after["cache_ttl_s"] == 60


def test_model_admin_refuses_a_zero_ttl(admin_client):
    model = model_create(actor=None, name="m1", task="chat")

    response = _post_model_form(admin_client, model, cache_enabled="on", cache_ttl_s="0")

    assert response.status_code == 200
    assert "Must be at least 1." in response.content.decode()
    assert Model.objects.get(pk=model.pk).cache_ttl_s == 3600


def test_tenant_admin_switches_the_result_cache_off(admin_client):
    tenant = tenant_create(actor=None, slug="acme", name="Acme", **LIMITS)
    url = reverse("admin:tenants_tenant_change", args=[tenant.pk])
    form = {"name": "Acme", "status": "active", "weight": "1", **LIMITS,
            "max_request_bytes": "0"}  # fmt: skip  (an unchecked box: result_cache off)

    response = admin_client.post(url, form)

    assert response.status_code == 302, response.content
    assert Tenant.objects.get(pk=tenant.pk).result_cache is False
    event = AuditEvent.objects.filter(action="tenant.update").latest("id")
    assert (event.before, event.after) == ({"result_cache": True}, {"result_cache": False})


def test_services_validate_and_the_snapshot_follows(db):
    tenant = tenant_create(actor=None, slug="acme", name="Acme", result_cache=False, **LIMITS)
    model = model_create(actor=None, name="m1", task="chat", cache_shared=True)
    assert AuditEvent.objects.get(action="model.create").after["cache_shared"] is True
    assert "result_cache" in AuditEvent.objects.get(action="tenant.create").after
    with pytest.raises(ValidationError):
        model_update(actor=None, model=model, cache_ttl_s=-5)
    with pytest.raises(ValidationError):
        model_create(actor=None, name="m2", task="chat", cache_colour="red")
    with pytest.raises(ValidationError):
        tenant_update(actor=None, tenant=tenant, result_cache=1)
    tenant_update(actor=None, tenant=tenant, result_cache=True)
    assert snapshot_build().tenants["acme"].result_cache is True
