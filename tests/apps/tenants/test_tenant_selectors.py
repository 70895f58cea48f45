"""Reads: tenant_get, tenant_list, tenant_entitlements, api_keys_active, audit_events_for ..."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from apps.tenants.selectors import (
    TenantEntitlements,
    api_key_get_by_prefix,
    api_keys_active,
    api_keys_for_tenant,
    audit_events_for,
    membership_list,
    memberships_for_user,
    request_class_list,
    tenant_entitlements,
    tenant_get,
    tenant_list,
)
from apps.tenants.services import (
    api_key_create,
    api_key_revoke,
    membership_create,
    tenant_suspend,
    tenant_update,
)

pytestmark = [pytest.mark.db, pytest.mark.django_db]


def test_tenant_get(tenant):
    assert tenant_get("acme") == tenant
    assert tenant_get("nobody") is None


def test_tenant_list_all_and_by_status(make_tenant):
    make_tenant("beta")
    alpha = make_tenant("alpha")
    tenant_suspend(actor=None, tenant=alpha)

    assert [t.slug for t in tenant_list()] == ["alpha", "beta"]
    assert [t.slug for t in tenant_list(status="suspended")] == ["alpha"]


def test_tenant_entitlements(tenant, classes):
    tenant_update(actor=None, tenant=tenant, allowed_classes=["batch", "interactive", "standard"])

    assert tenant_entitlements(tenant) == TenantEntitlements(
        classes=("interactive", "standard", "batch"),
        default_class="standard",
        weight=1.0,
        rpm_limit=600,
        tpm_limit=100_000,
        max_concurrency=8,
        max_context_tokens=8192,
        max_output_tokens=1024,
    )


def test_request_class_list_most_urgent_first(classes):
    assert [c.name for c in request_class_list()] == ["interactive", "standard", "batch"]


def test_api_keys_active_excludes_revoked_and_expired(tenant):
    forever, _ = api_key_create(actor=None, tenant=tenant, name="forever")
    soon, _ = api_key_create(
        actor=None, tenant=tenant, name="soon", expires_at=timezone.now() + timedelta(hours=1)
    )
    revoked, _ = api_key_create(actor=None, tenant=tenant, name="revoked")
    api_key_revoke(actor=None, api_key=revoked)

    assert set(api_keys_active()) == {forever, soon}
    assert set(api_keys_active(now=timezone.now() + timedelta(hours=2))) == {forever}
    assert set(api_keys_for_tenant(tenant)) == {forever, soon, revoked}


def test_api_key_get_by_prefix(tenant):
    api_key, _ = api_key_create(actor=None, tenant=tenant, name="ci")

    assert api_key_get_by_prefix(api_key.prefix) == api_key
    assert api_key_get_by_prefix("missing0") is None


def test_memberships(tenant):
    user = get_user_model().objects.create_user(username="eve")
    membership = membership_create(actor=None, user=user, tenant=tenant, role="viewer")

    assert list(memberships_for_user(user.pk)) == [membership]
    assert list(membership_list(tenant)) == [membership]


def test_audit_events_for_one_target_newest_first(make_tenant):
    acme = make_tenant("acme")
    make_tenant("other")
    tenant_update(actor=None, tenant=acme, rpm_limit=700)

    assert [e.action for e in audit_events_for(acme)] == ["tenant.update", "tenant.create"]
