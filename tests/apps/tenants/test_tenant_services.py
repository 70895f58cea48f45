"""tenant_create / tenant_update / tenant_suspend / tenant_activate."""

from __future__ import annotations

import pytest
from django.core.exceptions import ValidationError

from apps.common.models import AuditEvent
from apps.models.models import Model
from apps.tenants.models import Tenant
from apps.tenants.services import (
    TENANT_LIMIT_FIELDS,
    tenant_activate,
    tenant_create,
    tenant_suspend,
    tenant_update,
)

pytestmark = [pytest.mark.db, pytest.mark.django_db]


@pytest.fixture
def create(limits):
    def make(**overrides):
        return tenant_create(actor=None, **{"slug": "acme", "name": "Acme", **limits, **overrides})

    return make


def test_create_stores_audits_and_publishes(admin_user, classes, publishes, limits):
    tenant = tenant_create(
        actor=admin_user,
        slug="acme-labs",
        name="Acme Labs",
        weight=2,
        **limits,
        allowed_classes=[classes["interactive"], "batch"],
        default_class="interactive",
    )

    tenant.refresh_from_db()
    assert tenant.status == Tenant.Status.ACTIVE
    assert tenant.weight == 2.0
    assert tenant.default_class == classes["interactive"]
    assert set(tenant.allowed_classes.values_list("name", flat=True)) == {"interactive", "batch"}
    event = AuditEvent.objects.get(action="tenant.create")
    assert event.actor_label == admin_user.username
    assert event.target_type == "tenants.tenant"
    assert event.after == {
        "slug": "acme-labs",
        "name": "Acme Labs",
        "status": "active",
        "weight": 2.0,
        **limits,
        "max_request_bytes": 0,
        "allowed_classes": ["batch", "interactive"],
        "default_class": "interactive",
        "allowed_models": [],
    }
    assert publishes.pending


def test_create_without_classes(create):
    tenant = create()

    assert tenant.default_class is None
    assert not tenant.allowed_classes.exists()


@pytest.mark.parametrize("weight", [0, 0.0, -1, -0.5, float("nan"), float("inf")])
def test_create_refuses_weight_not_above_zero(weight, create):
    with pytest.raises(ValidationError) as excinfo:
        create(weight=weight)

    assert "Weight must be greater than 0" in excinfo.value.message_dict["weight"][0]
    assert not Tenant.objects.exists()
    assert not AuditEvent.objects.exists()


def test_create_refuses_non_numeric_weight(create):
    with pytest.raises(ValidationError) as excinfo:
        create(weight="heavy")

    assert "Weight must be a number" in excinfo.value.message_dict["weight"][0]


@pytest.mark.parametrize("field", TENANT_LIMIT_FIELDS)
@pytest.mark.parametrize("value", [0, -1, -10_000])
def test_create_refuses_limit_not_positive(field, value, create):
    with pytest.raises(ValidationError) as excinfo:
        create(**{field: value})

    assert "must be a positive whole number" in excinfo.value.message_dict[field][0]
    assert not Tenant.objects.exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [(2**31, "at most 2147483647"), (1.5, "whole number"), (True, "whole number"), (None, "whole")],
)
def test_create_refuses_limit_out_of_range_or_not_int(value, message, create):
    with pytest.raises(ValidationError) as excinfo:
        create(rpm_limit=value)

    assert message in excinfo.value.message_dict["rpm_limit"][0]


@pytest.mark.parametrize(("value", "message"), [(-1, "at least 0"), (1.5, "whole number")])
def test_the_request_size_cap_must_be_a_whole_number_not_below_zero(value, message, create):
    with pytest.raises(ValidationError) as excinfo:
        create(max_request_bytes=value)
    assert message in excinfo.value.message_dict["max_request_bytes"][0]
    assert not Tenant.objects.exists()

    tenant = create(max_request_bytes=4096)
    assert tenant.max_request_bytes == 4096
    with pytest.raises(ValidationError) as excinfo:
        tenant_update(actor=None, tenant=tenant, max_request_bytes=-5)
    assert "max_request_bytes" in excinfo.value.message_dict
    tenant_update(actor=None, tenant=tenant, max_request_bytes=0)  # 0: the router's cap only
    tenant.refresh_from_db()
    assert tenant.max_request_bytes == 0


def test_create_reports_every_bad_field_at_once(create):
    with pytest.raises(ValidationError) as excinfo:
        create(weight=0, tpm_limit=-1, max_concurrency=0)

    assert set(excinfo.value.message_dict) == {"weight", "tpm_limit", "max_concurrency"}


@pytest.mark.parametrize("slug", ["Acme", "-acme", "acme-", "acme_labs", "ac me", "", "a" * 64])
def test_create_refuses_bad_slug(slug, create):
    with pytest.raises(ValidationError) as excinfo:
        create(slug=slug)

    assert "slug" in excinfo.value.message_dict


def test_create_refuses_duplicate_slug(create):
    create()

    with pytest.raises(ValidationError) as excinfo:
        create()

    assert "already exists" in excinfo.value.message_dict["slug"][0]


@pytest.mark.parametrize("name", ["", "   ", "x" * 201])
def test_create_refuses_bad_name(name, create):
    with pytest.raises(ValidationError) as excinfo:
        create(name=name)

    assert "name" in excinfo.value.message_dict


def test_create_refuses_default_class_outside_allowed(classes, create):
    with pytest.raises(ValidationError) as excinfo:
        create(allowed_classes=[classes["standard"]], default_class=classes["batch"])

    assert (
        "must be one of the tenant's allowed classes"
        in (excinfo.value.message_dict["default_class"][0])
    )
    assert not Tenant.objects.exists()


def test_create_refuses_default_class_without_allowed_classes(classes, create):
    with pytest.raises(ValidationError) as excinfo:
        create(default_class=classes["batch"])

    assert "default_class" in excinfo.value.message_dict


def test_create_refuses_unknown_class_name(classes, create):
    with pytest.raises(ValidationError) as excinfo:
        create(allowed_classes=["standard", "premium"])

    assert "Unknown request class 'premium'" in excinfo.value.message_dict["allowed_classes"][0]


def test_create_refuses_classes_given_as_one_string(classes, create):
    with pytest.raises(ValidationError) as excinfo:
        create(allowed_classes="standard")

    assert "allowed_classes" in excinfo.value.message_dict


def test_update_changes_limits_audits_diff_and_publishes(admin_user, tenant, publishes):
    publishes.reset()

    tenant_update(actor=admin_user, tenant=tenant, rpm_limit=1200, max_concurrency=8, weight=3)

    tenant.refresh_from_db()
    assert (tenant.rpm_limit, tenant.weight) == (1200, 3.0)
    event = AuditEvent.objects.get(action="tenant.update")
    assert event.before == {"rpm_limit": 600, "weight": 1.0}
    assert event.after == {"rpm_limit": 1200, "weight": 3.0}
    assert publishes.pending


def test_update_changes_classes(tenant, classes):
    tenant_update(
        actor=None, tenant=tenant, allowed_classes=["batch"], default_class=classes["batch"]
    )

    tenant.refresh_from_db()
    assert list(tenant.allowed_classes.values_list("name", flat=True)) == ["batch"]
    assert tenant.default_class == classes["batch"]
    event = AuditEvent.objects.get(action="tenant.update")
    assert event.before == {
        "allowed_classes": ["interactive", "standard"],
        "default_class": "standard",
    }
    assert event.after == {"allowed_classes": ["batch"], "default_class": "batch"}


def test_update_can_clear_the_default_class(tenant):
    tenant_update(actor=None, tenant=tenant, default_class=None)

    tenant.refresh_from_db()
    assert tenant.default_class is None


def test_update_refuses_dropping_the_default_class_from_allowed(tenant, classes):
    with pytest.raises(ValidationError) as excinfo:
        tenant_update(actor=None, tenant=tenant, allowed_classes=[classes["interactive"]])

    assert "default_class" in excinfo.value.message_dict
    assert tenant.allowed_classes.count() == 2


@pytest.mark.parametrize(
    ("changes", "field"),
    [
        ({"weight": 0}, "weight"),
        ({"weight": -2}, "weight"),
        ({"tpm_limit": -1}, "tpm_limit"),
        ({"max_output_tokens": 0}, "max_output_tokens"),
        ({"status": "deleted"}, "status"),
        ({"name": ""}, "name"),
    ],
)
def test_update_refuses_bad_value_and_changes_nothing(tenant, changes, field, limits):
    with pytest.raises(ValidationError) as excinfo:
        tenant_update(actor=None, tenant=Tenant.objects.get(pk=tenant.pk), **changes)

    assert field in excinfo.value.message_dict
    stored = Tenant.objects.get(pk=tenant.pk)
    assert (stored.weight, stored.tpm_limit, stored.status) == (1.0, limits["tpm_limit"], "active")
    assert not AuditEvent.objects.filter(action="tenant.update").exists()


def test_update_refuses_slug_change(tenant):
    with pytest.raises(ValidationError, match="cannot be changed: slug"):
        tenant_update(actor=None, tenant=tenant, slug="other")


def test_update_without_a_change_writes_nothing(tenant, publishes, limits):
    publishes.reset()

    tenant_update(actor=None, tenant=tenant, rpm_limit=limits["rpm_limit"], name=tenant.name)

    assert not AuditEvent.objects.filter(action="tenant.update").exists()
    assert not publishes.pending


def test_suspend_then_activate(admin_user, tenant, publishes):
    publishes.reset()

    tenant_suspend(actor=admin_user, tenant=tenant)

    assert Tenant.objects.get(pk=tenant.pk).status == Tenant.Status.SUSPENDED
    event = AuditEvent.objects.get(action="tenant.suspend")
    assert (event.before, event.after) == ({"status": "active"}, {"status": "suspended"})
    assert publishes.pending

    publishes.reset()
    tenant_activate(actor=admin_user, tenant=tenant)

    assert Tenant.objects.get(pk=tenant.pk).status == Tenant.Status.ACTIVE
    assert AuditEvent.objects.filter(action="tenant.activate").exists()
    assert publishes.pending


def test_suspend_twice_refused(tenant):
    tenant_suspend(actor=None, tenant=tenant)

    with pytest.raises(ValidationError, match="already suspended"):
        tenant_suspend(actor=None, tenant=tenant)


def test_activate_active_tenant_refused(tenant):
    with pytest.raises(ValidationError, match="already active"):
        tenant_activate(actor=None, tenant=tenant)


def test_create_and_update_allowed_models(create, publishes):
    chat = Model.objects.create(name="chat-model", task="chat")
    Model.objects.create(name="emb-model", task="embedding")
    tenant = create(allowed_models=["chat-model"])
    assert list(tenant.allowed_models.values_list("name", flat=True)) == ["chat-model"]
    assert AuditEvent.objects.get(action="tenant.create").after["allowed_models"] == ["chat-model"]

    publishes.reset()
    tenant_update(actor=None, tenant=tenant, allowed_models=[chat, "emb-model"])
    assert set(tenant.allowed_models.values_list("name", flat=True)) == {"chat-model", "emb-model"}
    event = AuditEvent.objects.filter(action="tenant.update").latest("id")
    assert event.before == {"allowed_models": ["chat-model"]}
    assert event.after == {"allowed_models": ["chat-model", "emb-model"]}
    assert publishes.pending

    tenant_update(actor=None, tenant=tenant, allowed_models=[])
    assert not tenant.allowed_models.exists()  # empty means every model


def test_create_refuses_unknown_model(create):
    with pytest.raises(ValidationError) as exc:
        create(allowed_models=["no-such-model"])
    assert "Unknown model 'no-such-model'" in str(exc.value)
    assert not Tenant.objects.exists()
