"""request_class_create / request_class_update: happy paths and every refusal."""

from __future__ import annotations

from typing import Any

import pytest
from django.core.exceptions import ValidationError

from apps.common.models import AuditEvent
from apps.tenants.models import RequestClass
from apps.tenants.services import request_class_create, request_class_update

pytestmark = [pytest.mark.db, pytest.mark.django_db]

GOOD: dict[str, Any] = {
    "name": "realtime",
    "priority_band": 0,
    "ttft_slo_ms": 200,
    "deadline_ms": 2_000,
    "max_queue_length": 50,
    "shed_order": 9,
    "heartbeat_ms": 1_000,
    "itl_slo_ms": 80,
}


def test_create_stores_audits_and_publishes(admin_user, publishes):
    request_class = request_class_create(actor=admin_user, **GOOD)

    request_class.refresh_from_db()
    assert (request_class.name, request_class.deadline_ms) == ("realtime", 2_000)
    event = AuditEvent.objects.get(action="request_class.create")
    assert event.actor_id == admin_user.pk
    assert event.actor_label == admin_user.username
    assert event.target_id == str(request_class.pk)
    assert event.before is None
    assert event.after == GOOD
    assert publishes.pending


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("name", "Realtime", "lower-case"),
        ("name", "", "lower-case"),
        ("name", "9lives", "starting with a letter"),
        ("name", "x" * 41, "1-40"),
        ("priority_band", -1, "at least 0"),
        ("priority_band", 40_000, "at most 32767"),
        ("shed_order", -2, "at least 0"),
        ("ttft_slo_ms", 0, "positive whole number"),
        ("deadline_ms", -5, "positive whole number"),
        ("max_queue_length", 0, "positive whole number"),
        ("max_queue_length", "50", "whole number"),
        ("ttft_slo_ms", 2.5, "whole number"),
        ("heartbeat_ms", 5_001, "at most 5000"),  # a queued stream hears every 5 s at most
        ("heartbeat_ms", -1, "at least 0"),
        ("itl_slo_ms", 0, "positive whole number"),
    ],
)
def test_create_refuses_bad_value(field, value, message):
    with pytest.raises(ValidationError) as excinfo:
        request_class_create(actor=None, **{**GOOD, field: value})

    assert field in excinfo.value.message_dict
    assert message in " ".join(excinfo.value.message_dict[field])
    assert not RequestClass.objects.exists()
    assert not AuditEvent.objects.exists()


def test_create_refuses_deadline_shorter_than_ttft():
    with pytest.raises(ValidationError) as excinfo:
        request_class_create(actor=None, **{**GOOD, "ttft_slo_ms": 3_000, "deadline_ms": 2_000})

    assert "must not be shorter than the TTFT SLO" in excinfo.value.message_dict["deadline_ms"][0]


def test_create_accepts_deadline_equal_to_ttft():
    request_class = request_class_create(actor=None, **{**GOOD, "deadline_ms": 200})

    assert request_class.deadline_ms == request_class.ttft_slo_ms


def test_create_refuses_duplicate_name():
    request_class_create(actor=None, **GOOD)

    with pytest.raises(ValidationError, match="already exists"):
        request_class_create(actor=None, **GOOD)
    assert RequestClass.objects.count() == 1


def test_update_audits_only_changed_fields_and_publishes(admin_user, publishes):
    request_class = request_class_create(actor=None, **GOOD)
    publishes.reset()

    request_class_update(
        actor=admin_user, request_class=request_class, max_queue_length=80, shed_order=9
    )

    request_class.refresh_from_db()
    assert request_class.max_queue_length == 80
    event = AuditEvent.objects.get(action="request_class.update")
    assert event.before == {"max_queue_length": 50}
    assert event.after == {"max_queue_length": 80}
    assert publishes.pending


def test_update_without_a_change_writes_nothing(publishes):
    request_class = request_class_create(actor=None, **GOOD)
    publishes.reset()

    request_class_update(actor=None, request_class=request_class, priority_band=0)

    assert not AuditEvent.objects.filter(action="request_class.update").exists()
    assert not publishes.pending


def test_update_checks_deadline_against_the_stored_ttft():
    request_class = request_class_create(actor=None, **GOOD)

    with pytest.raises(ValidationError) as excinfo:
        request_class_update(actor=None, request_class=request_class, deadline_ms=100)

    assert "deadline_ms" in excinfo.value.message_dict
    request_class.refresh_from_db()
    assert request_class.deadline_ms == 2_000


def test_update_refuses_zero_queue_length():
    request_class = request_class_create(actor=None, **GOOD)

    with pytest.raises(ValidationError) as excinfo:
        request_class_update(actor=None, request_class=request_class, max_queue_length=0)

    assert "max_queue_length" in excinfo.value.message_dict


def test_update_refuses_unknown_field():
    request_class = request_class_create(actor=None, **GOOD)

    with pytest.raises(ValidationError, match="cannot be changed: colour"):
        request_class_update(actor=None, request_class=request_class, colour="red")


def test_update_refuses_rename_onto_existing_name():
    request_class_create(actor=None, **GOOD)
    other = request_class_create(actor=None, **{**GOOD, "name": "bulk"})

    with pytest.raises(ValidationError, match="already exists"):
        request_class_update(actor=None, request_class=other, name="realtime")


def test_update_renames(admin_user):
    request_class = request_class_create(actor=None, **GOOD)

    request_class_update(actor=admin_user, request_class=request_class, name="live")

    assert RequestClass.objects.get(pk=request_class.pk).name == "live"
