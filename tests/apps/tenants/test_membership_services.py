"""membership_create / membership_update_role / membership_delete."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError

from apps.common.models import AuditEvent
from apps.tenants.models import Membership
from apps.tenants.services import membership_create, membership_delete, membership_update_role

pytestmark = [pytest.mark.db, pytest.mark.django_db]


@pytest.fixture
def user():
    return get_user_model().objects.create_user(username="dana", password="x")


def test_create_audits_and_does_not_publish(admin_user, user, tenant, publishes):
    publishes.reset()

    membership = membership_create(actor=admin_user, user=user, tenant=tenant, role="admin")

    assert Membership.objects.get(pk=membership.pk).role == Membership.Role.ADMIN
    event = AuditEvent.objects.get(action="membership.create")
    assert event.after == {"user": "dana", "tenant": tenant.slug, "role": "admin"}
    assert not publishes.pending  # the data plane does not hold memberships


def test_create_refuses_unknown_role(user, tenant):
    with pytest.raises(ValidationError) as excinfo:
        membership_create(actor=None, user=user, tenant=tenant, role="superuser")

    assert "Role must be one of: owner, admin, viewer" in excinfo.value.message_dict["role"][0]
    assert not Membership.objects.exists()


def test_create_refuses_second_membership_in_same_tenant(user, tenant):
    membership_create(actor=None, user=user, tenant=tenant, role="viewer")

    with pytest.raises(ValidationError) as excinfo:
        membership_create(actor=None, user=user, tenant=tenant, role="owner")

    assert "already a member" in excinfo.value.message_dict["user"][0]
    assert Membership.objects.count() == 1


def test_same_user_in_two_tenants(user, make_tenant):
    membership_create(actor=None, user=user, tenant=make_tenant("one"), role="viewer")
    membership_create(actor=None, user=user, tenant=make_tenant("two"), role="owner")

    assert Membership.objects.filter(user=user).count() == 2


def test_update_role_audits(admin_user, user, tenant):
    membership = membership_create(actor=None, user=user, tenant=tenant, role="viewer")

    membership_update_role(actor=admin_user, membership=membership, role="owner")

    assert Membership.objects.get(pk=membership.pk).role == "owner"
    event = AuditEvent.objects.get(action="membership.update_role")
    assert (event.before, event.after) == ({"role": "viewer"}, {"role": "owner"})


def test_update_role_refuses_unknown_role(user, tenant):
    membership = membership_create(actor=None, user=user, tenant=tenant, role="viewer")

    with pytest.raises(ValidationError) as excinfo:
        membership_update_role(actor=None, membership=membership, role="god")

    assert "role" in excinfo.value.message_dict
    assert Membership.objects.get(pk=membership.pk).role == "viewer"


def test_update_to_same_role_writes_nothing(user, tenant):
    membership = membership_create(actor=None, user=user, tenant=tenant, role="viewer")

    membership_update_role(actor=None, membership=membership, role="viewer")

    assert not AuditEvent.objects.filter(action="membership.update_role").exists()


def test_delete_removes_and_audits(admin_user, user, tenant):
    membership = membership_create(actor=None, user=user, tenant=tenant, role="viewer")
    membership_id = membership.pk

    membership_delete(actor=admin_user, membership=membership)

    assert not Membership.objects.exists()
    event = AuditEvent.objects.get(action="membership.delete")
    assert event.target_id == str(membership_id)
    assert event.before == {"user": "dana", "tenant": tenant.slug, "role": "viewer"}
    assert event.after is None
