"""audit_record, and the audit log being append-only in the model, the queryset and the database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.contrib.auth import get_user_model
from django.db import IntegrityError, connection, transaction

from apps.common.audit import audit_record
from apps.common.models import AuditEvent

pytestmark = [pytest.mark.db, pytest.mark.django_db]


@pytest.fixture
def event(tenant):
    return audit_record(actor=None, action="test.event", target=tenant, after={"x": 1})


def test_record_by_the_system(tenant):
    event = audit_record(actor=None, action="tenant.poke", target=tenant)

    event.refresh_from_db()
    assert event.actor_id is None
    assert event.actor_label == "system"
    assert (event.target_type, event.target_id, event.target_repr) == (
        "tenants.tenant",
        str(tenant.pk),
        "acme",
    )
    assert (event.before, event.after) == (None, None)
    assert event.created_at is not None


def test_record_by_a_user_with_json_unsafe_values(admin_user, tenant):
    when = datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)
    ident = uuid.uuid4()

    event = audit_record(
        actor=admin_user,
        action="tenant.poke",
        target=tenant,
        before={"price": Decimal("0.125"), "at": when},
        after={"id": ident, "tags": ("a", "b")},
    )

    event.refresh_from_db()
    assert event.actor_id == admin_user.pk
    assert event.actor_label == admin_user.get_username()
    assert event.before == {"price": "0.125", "at": "2030-01-02T03:04:05.678901+00:00"}
    assert event.after == {"id": str(ident), "tags": ["a", "b"]}


def test_model_save_of_existing_event_refused(event):
    event.action = "tampered"

    with pytest.raises(PermissionError, match="append-only"):
        event.save()
    assert AuditEvent.objects.get(pk=event.pk).action == "test.event"


def test_model_delete_refused(event):
    with pytest.raises(PermissionError, match="append-only"):
        event.delete()
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_queryset_update_refused(event):
    with pytest.raises(PermissionError, match="append-only"):
        AuditEvent.objects.filter(pk=event.pk).update(action="tampered")
    assert AuditEvent.objects.get(pk=event.pk).action == "test.event"


def test_queryset_delete_refused(event):
    with pytest.raises(PermissionError, match="append-only"):
        AuditEvent.objects.all().delete()
    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_raw_sql_update_refused_by_trigger(event):
    with (
        pytest.raises(IntegrityError, match="append-only: UPDATE"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "UPDATE tenants_auditevent SET action = %s WHERE id = %s", ["tampered", event.pk]
        )

    assert AuditEvent.objects.get(pk=event.pk).action == "test.event"


def test_raw_sql_delete_refused_by_trigger(event):
    with (
        pytest.raises(IntegrityError, match="append-only: DELETE"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute("DELETE FROM tenants_auditevent WHERE id = %s", [event.pk])

    assert AuditEvent.objects.filter(pk=event.pk).exists()


def test_raw_sql_update_refused_even_when_it_also_clears_actor(admin_user, tenant):
    event = audit_record(actor=admin_user, action="test.event", target=tenant)

    with (
        pytest.raises(IntegrityError, match="append-only"),
        transaction.atomic(),
        connection.cursor() as cursor,
    ):
        cursor.execute(
            "UPDATE tenants_auditevent SET actor_id = NULL, after = '{}' WHERE id = %s",
            [event.pk],
        )


def test_deleting_the_acting_user_keeps_the_event_and_its_label(tenant):
    user = get_user_model().objects.create_user(username="leaver")
    event = audit_record(actor=user, action="test.event", target=tenant)

    user.delete()  # ON DELETE SET NULL: the one update the trigger lets through

    event.refresh_from_db()
    assert event.actor_id is None
    assert event.actor_label == "leaver"
    assert event.action == "test.event"
