"""The admin: writes go through the services; invalid values come back as form errors."""

from __future__ import annotations

import hashlib
import re

import pytest
from django.contrib.auth import get_user_model
from django.urls import reverse

from apps.common.models import AuditEvent
from apps.tenants.models import ApiKey, Membership, RequestClass, Tenant
from apps.tenants.services import api_key_create, api_key_revoke, membership_create

pytestmark = [pytest.mark.db, pytest.mark.django_db]

KEY_RE = re.compile(r"sy_[a-z0-9]{8}_[A-Za-z0-9]{40}")


@pytest.fixture
def tenant_form(classes, limits):
    return {
        "slug": "acme",
        "name": "Acme",
        "status": "active",
        "weight": "1.5",
        **{field: str(value) for field, value in limits.items()},
        "max_request_bytes": "0",
        "result_cache": "on",  # the checkbox, checked by default, as a browser sends it
        "allowed_classes": [classes["interactive"].pk, classes["standard"].pk],
        "default_class": classes["standard"].pk,
    }


def _errors(response) -> dict[str, list[str]]:
    form = response.context["adminform"].form
    return {field: list(errors) for field, errors in form.errors.items()}


def test_create_tenant_via_admin(admin_client, admin_user, tenant_form):
    response = admin_client.post(reverse("admin:tenants_tenant_add"), tenant_form)

    assert response.status_code == 302
    tenant = Tenant.objects.get(slug="acme")
    assert tenant.weight == 1.5
    assert set(tenant.allowed_classes.values_list("name", flat=True)) == {"interactive", "standard"}
    event = AuditEvent.objects.get(action="tenant.create")
    assert event.actor_id == admin_user.pk
    assert event.after["allowed_classes"] == ["interactive", "standard"]


def test_create_suspended_tenant_via_admin(admin_client, tenant_form):
    response = admin_client.post(
        reverse("admin:tenants_tenant_add"), {**tenant_form, "status": "suspended"}
    )

    assert response.status_code == 302
    assert Tenant.objects.get(slug="acme").status == "suspended"
    assert AuditEvent.objects.filter(action="tenant.suspend").exists()


@pytest.mark.parametrize("weight", ["0", "-1"])
def test_admin_refuses_weight_not_above_zero(admin_client, tenant_form, weight):
    response = admin_client.post(
        reverse("admin:tenants_tenant_add"), {**tenant_form, "weight": weight}
    )

    assert response.status_code == 200
    assert any("Weight must be greater than 0" in e for e in _errors(response)["weight"])
    assert b"Weight must be greater than 0" in response.content
    assert not Tenant.objects.exists()
    assert not AuditEvent.objects.filter(action="tenant.create").exists()


def test_admin_refuses_negative_limit(admin_client, tenant_form):
    response = admin_client.post(
        reverse("admin:tenants_tenant_add"), {**tenant_form, "tpm_limit": "-5"}
    )

    assert response.status_code == 200
    assert _errors(response)["tpm_limit"] == [
        "Tokens-per-minute limit must be a positive whole number (got -5)."
    ]
    assert not Tenant.objects.exists()


def test_admin_sets_and_refuses_the_request_size_cap(admin_client, tenant_form):
    url = reverse("admin:tenants_tenant_add")
    response = admin_client.post(url, {**tenant_form, "max_request_bytes": "-1"})
    assert response.status_code == 200
    assert "max_request_bytes" in _errors(response)
    assert not Tenant.objects.exists()

    response = admin_client.post(url, {**tenant_form, "max_request_bytes": "65536"})
    assert response.status_code == 302
    assert Tenant.objects.get(slug="acme").max_request_bytes == 65536


def test_admin_reads_a_blank_request_size_cap_as_no_cap(admin_client, tenant_form):
    form = {k: v for k, v in tenant_form.items() if k != "max_request_bytes"}
    response = admin_client.post(reverse("admin:tenants_tenant_add"), form)
    assert response.status_code == 302
    assert Tenant.objects.get(slug="acme").max_request_bytes == 0


def test_admin_refuses_default_class_outside_allowed(admin_client, tenant_form, classes):
    response = admin_client.post(
        reverse("admin:tenants_tenant_add"),
        {**tenant_form, "default_class": classes["batch"].pk},
    )

    assert response.status_code == 200
    assert "must be one of the tenant's allowed classes" in _errors(response)["default_class"][0]


def test_admin_refuses_bad_slug(admin_client, tenant_form):
    response = admin_client.post(
        reverse("admin:tenants_tenant_add"), {**tenant_form, "slug": "Acme"}
    )

    assert response.status_code == 200
    assert "slug" in _errors(response)


def _change_form(tenant_form):
    return {k: v for k, v in tenant_form.items() if k != "slug"}


def test_change_limits_via_admin_writes_audit_event(admin_client, admin_user, tenant, tenant_form):
    url = reverse("admin:tenants_tenant_change", args=[tenant.pk])
    data = {**_change_form(tenant_form), "weight": "1.0", "rpm_limit": "1200"}

    response = admin_client.post(url, data)

    assert response.status_code == 302
    tenant.refresh_from_db()
    assert tenant.rpm_limit == 1200
    event = AuditEvent.objects.get(action="tenant.update")
    assert event.actor_id == admin_user.pk
    assert (event.before, event.after) == ({"rpm_limit": 600}, {"rpm_limit": 1200})


def test_change_with_weight_zero_changes_nothing(admin_client, tenant, tenant_form):
    url = reverse("admin:tenants_tenant_change", args=[tenant.pk])

    response = admin_client.post(url, {**_change_form(tenant_form), "weight": "0"})

    assert response.status_code == 200
    assert "weight" in _errors(response)
    tenant.refresh_from_db()
    assert tenant.weight == 1.0
    assert not AuditEvent.objects.filter(action="tenant.update").exists()


def test_tenant_actions_suspend_and_activate(admin_client, tenant):
    url = reverse("admin:tenants_tenant_changelist")

    admin_client.post(url, {"action": "suspend_selected", "_selected_action": [tenant.pk]})
    assert Tenant.objects.get(pk=tenant.pk).status == "suspended"

    admin_client.post(url, {"action": "activate_selected", "_selected_action": [tenant.pk]})
    assert Tenant.objects.get(pk=tenant.pk).status == "active"


def test_tenant_cannot_be_deleted_via_admin(admin_client, tenant):
    response = admin_client.post(reverse("admin:tenants_tenant_delete", args=[tenant.pk]))

    assert response.status_code == 403
    assert Tenant.objects.filter(pk=tenant.pk).exists()


def test_request_class_admin_create_and_refuse(admin_client):
    url = reverse("admin:tenants_requestclass_add")
    data = {
        "name": "realtime",
        "priority_band": "0",
        "ttft_slo_ms": "300",
        "deadline_ms": "200",
        "max_queue_length": "10",
        "shed_order": "5",
        "heartbeat_ms": "5000",
        "itl_slo_ms": "200",
    }

    refused = admin_client.post(url, data)
    created = admin_client.post(url, {**data, "deadline_ms": "3000"})

    assert refused.status_code == 200
    assert "must not be shorter than the TTFT SLO" in _errors(refused)["deadline_ms"][0]
    assert created.status_code == 302
    assert RequestClass.objects.get(name="realtime").deadline_ms == 3000
    assert AuditEvent.objects.filter(action="request_class.create").count() == 1


def test_request_class_admin_change_goes_through_service(admin_client, classes):
    batch = classes["batch"]
    url = reverse("admin:tenants_requestclass_change", args=[batch.pk])
    data = {
        "name": "batch",
        "priority_band": "2",
        "ttft_slo_ms": "60000",
        "deadline_ms": "3600000",
        "max_queue_length": "20000",
        "shed_order": "1",
        "heartbeat_ms": "5000",
        "itl_slo_ms": "200",
    }

    response = admin_client.post(url, data)

    assert response.status_code == 302
    event = AuditEvent.objects.get(action="request_class.update")
    assert event.after == {"max_queue_length": 20000}


def test_create_api_key_via_admin_shows_full_key_once(admin_client, tenant):
    url = reverse("admin:tenants_apikey_add")
    data = {"tenant": tenant.pk, "name": "ci", "scopes": ["inference", "usage:read"]}

    response = admin_client.post(url, data, follow=True)

    assert response.status_code == 200
    shown = KEY_RE.findall(response.content.decode())
    assert len(shown) == 1
    api_key = ApiKey.objects.get()
    assert api_key.digest == hashlib.sha256(shown[0].encode()).hexdigest()
    assert api_key.scopes == ["inference", "usage:read"]
    again = admin_client.get(reverse("admin:tenants_apikey_change", args=[api_key.pk]))
    assert not KEY_RE.findall(again.content.decode())
    assert api_key.digest in again.content.decode()  # shown, read-only


def test_api_key_admin_refuses_unknown_scope_and_past_expiry(admin_client, tenant):
    data = {
        "tenant": tenant.pk,
        "name": "ci",
        "scopes": ["inference"],
        "expires_at_0": "2000-01-01",
        "expires_at_1": "00:00:00",
    }

    past = admin_client.post(reverse("admin:tenants_apikey_add"), data)
    bad_scope = admin_client.post(
        reverse("admin:tenants_apikey_add"), {"tenant": tenant.pk, "name": "x", "scopes": ["root"]}
    )

    assert past.status_code == 200
    assert "Expiry must be in the future" in _errors(past)["expires_at"][0]
    assert bad_scope.status_code == 200
    assert "scopes" in _errors(bad_scope)
    assert not ApiKey.objects.exists()


def test_api_key_cannot_be_edited_or_deleted_via_admin(admin_client, tenant):
    api_key, _ = api_key_create(actor=None, tenant=tenant, name="ci")
    change_url = reverse("admin:tenants_apikey_change", args=[api_key.pk])

    admin_client.post(change_url, {"name": "renamed", "digest": "0" * 64})
    deleted = admin_client.post(reverse("admin:tenants_apikey_delete", args=[api_key.pk]))

    api_key.refresh_from_db()
    assert (api_key.name, len(api_key.digest)) == ("ci", 64)
    assert api_key.digest != "0" * 64
    assert deleted.status_code == 403


def test_revoke_selected_keys_action(admin_client, admin_user, tenant):
    live, _ = api_key_create(actor=None, tenant=tenant, name="live")
    gone, _ = api_key_create(actor=None, tenant=tenant, name="gone")
    api_key_revoke(actor=None, api_key=gone)
    url = reverse("admin:tenants_apikey_changelist")

    response = admin_client.post(
        url, {"action": "revoke_selected", "_selected_action": [live.pk, gone.pk]}, follow=True
    )

    live.refresh_from_db()
    assert live.revoked_at is not None
    assert b"Revoked 1 key(s) (1 already revoked" in response.content
    revokes = AuditEvent.objects.filter(action="api_key.revoke")
    assert [e.actor_id for e in revokes] == [admin_user.pk, None]


def test_membership_admin_create_change_delete(admin_client, tenant):
    user = get_user_model().objects.create_user(username="mo")
    add = admin_client.post(
        reverse("admin:tenants_membership_add"),
        {"user": user.pk, "tenant": tenant.pk, "role": "viewer"},
    )
    membership = Membership.objects.get()

    change = admin_client.post(
        reverse("admin:tenants_membership_change", args=[membership.pk]), {"role": "owner"}
    )
    delete = admin_client.post(
        reverse("admin:tenants_membership_delete", args=[membership.pk]), {"post": "yes"}
    )

    assert (add.status_code, change.status_code, delete.status_code) == (302, 302, 302)
    assert not Membership.objects.exists()
    actions = set(AuditEvent.objects.values_list("action", flat=True))
    assert {"membership.create", "membership.update_role", "membership.delete"} <= actions


def test_membership_admin_refuses_bad_role_and_duplicate(admin_client, tenant):
    user = get_user_model().objects.create_user(username="mo")
    membership_create(actor=None, user=user, tenant=tenant, role="viewer")
    url = reverse("admin:tenants_membership_add")

    bad_role = admin_client.post(url, {"user": user.pk, "tenant": tenant.pk, "role": "god"})
    duplicate = admin_client.post(url, {"user": user.pk, "tenant": tenant.pk, "role": "owner"})

    assert bad_role.status_code == 200
    assert "role" in _errors(bad_role)
    assert duplicate.status_code == 200
    assert b"already exists" in duplicate.content
    assert Membership.objects.count() == 1


def test_membership_bulk_delete_goes_through_service(admin_client, tenant):
    for name in ("a", "b"):
        user = get_user_model().objects.create_user(username=name)
        membership_create(actor=None, user=user, tenant=tenant, role="viewer")

    admin_client.post(
        reverse("admin:tenants_membership_changelist"),
        {
            "action": "delete_selected",
            "_selected_action": list(Membership.objects.values_list("pk", flat=True)),
            "post": "yes",
        },
    )

    assert not Membership.objects.exists()
    assert AuditEvent.objects.filter(action="membership.delete").count() == 2


def test_audit_event_admin_is_read_only(admin_client, tenant):
    event = AuditEvent.objects.get(action="tenant.create")

    listing = admin_client.get(reverse("admin:common_auditevent_changelist"))
    view = admin_client.get(reverse("admin:common_auditevent_change", args=[event.pk]))
    add = admin_client.get(reverse("admin:common_auditevent_add"))
    post = admin_client.post(
        reverse("admin:common_auditevent_change", args=[event.pk]), {"action": "x"}
    )
    delete = admin_client.post(
        reverse("admin:common_auditevent_delete", args=[event.pk]), {"post": "yes"}
    )

    assert (listing.status_code, view.status_code) == (200, 200)
    assert (add.status_code, post.status_code, delete.status_code) == (403, 403, 403)
    assert AuditEvent.objects.get(pk=event.pk).action == "tenant.create"


def test_every_admin_page_renders(admin_client, tenant):
    api_key, _ = api_key_create(actor=None, tenant=tenant, name="ci")
    user = get_user_model().objects.create_user(username="mo")
    membership = membership_create(actor=None, user=user, tenant=tenant, role="viewer")
    objects = {
        "requestclass": tenant.default_class,
        "tenant": tenant,
        "apikey": api_key,
        "membership": membership,
    }
    for model, obj in objects.items():
        for url in (
            reverse(f"admin:tenants_{model}_changelist"),
            reverse(f"admin:tenants_{model}_change", args=[obj.pk]),
        ):
            assert admin_client.get(url).status_code == 200, url
        assert admin_client.get(reverse(f"admin:tenants_{model}_add")).status_code == 200
