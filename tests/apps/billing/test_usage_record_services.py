"""usage_record_create: the ledger write, exactly once per event id."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from apps.billing.models import UsageRecord
from apps.billing.selectors import usage_for_tenant, usage_totals
from apps.billing.services import usage_record_create
from apps.tenants.services import api_key_create

pytestmark = [pytest.mark.db, pytest.mark.django_db]

AT = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


@pytest.fixture
def record(tenant, version):
    def make(**overrides):
        values = {
            "event_id": "evt-1",
            "tenant": tenant,
            "version": version,
            "request_class": "standard",
            "tokens_in": 120,
            "tokens_out": 30,
            "credits": Decimal("0.105"),
            "cached": False,
            "queue_ms": 3.5,
            "ttft_ms": 80.0,
            "total_ms": 400.0,
            "outcome": "ok",
            "occurred_at": AT,
            **overrides,
        }
        return usage_record_create(**values)

    return make


def test_creates_a_record(record, tenant, version):
    usage, created = record()
    assert created
    usage.refresh_from_db()
    assert (usage.tenant, usage.version, usage.tokens_in, usage.tokens_out) == (
        tenant,
        version,
        120,
        30,
    )
    assert usage.credits == Decimal("0.105")
    assert usage.occurred_at == AT


def test_replay_returns_the_existing_record(record):
    first, created = record()
    again, created_again = record(tokens_out=999)  # a replay carries the same event

    assert created
    assert not created_again
    assert again.pk == first.pk
    assert again.tokens_out == 30
    assert UsageRecord.objects.count() == 1


def test_minimal_record_without_key_version_or_timings(record):
    usage, created = record(
        event_id="evt-2",
        version=None,
        queue_ms=None,
        ttft_ms=None,
        total_ms=None,
        outcome="rejected",
        tokens_out=0,
        credits=0,
    )
    assert created
    assert usage.version is None
    assert usage.ttft_ms is None


def test_record_with_the_tenants_api_key(record, tenant):
    key, _full = api_key_create(actor=None, tenant=tenant, name="ci")
    usage, _created = record(api_key=key)
    assert usage.api_key == key


def test_refuses_an_api_key_of_another_tenant(record, other_tenant):
    key, _full = api_key_create(actor=None, tenant=other_tenant, name="theirs")
    with pytest.raises(ValidationError) as excinfo:
        record(api_key=key)
    assert "does not belong to 'acme'" in excinfo.value.message_dict["api_key"][0]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"tokens_in": -1}, "tokens_in"),
        ({"tokens_out": -5}, "tokens_out"),
        ({"tokens_in": 1.5}, "tokens_in"),
        ({"tokens_out": 2**31}, "tokens_out"),
        ({"credits": Decimal("-0.01")}, "credits"),
        ({"event_id": ""}, "event_id"),
        ({"event_id": "x" * 65}, "event_id"),
        ({"request_class": ""}, "request_class"),
        ({"outcome": "timeout"}, "outcome"),
        ({"ttft_ms": -1.0}, "ttft_ms"),
        ({"queue_ms": float("nan")}, "queue_ms"),
        ({"occurred_at": datetime(2026, 11, 1, 12, 0)}, "occurred_at"),  # naive
        ({"occurred_at": "2026-11-01"}, "occurred_at"),
    ],
)
def test_refuses_bad_values(record, overrides, field):
    with pytest.raises(ValidationError) as excinfo:
        record(**overrides)
    assert field in excinfo.value.message_dict
    assert not UsageRecord.objects.exists()


def test_usage_selectors(record, tenant, other_tenant):
    record(event_id="a", occurred_at=AT - timedelta(days=2))
    record(event_id="b", occurred_at=AT, tokens_in=10, tokens_out=5, credits=Decimal(1))
    record(
        event_id="c",
        occurred_at=AT + timedelta(hours=1),
        tokens_in=20,
        tokens_out=7,
        credits=Decimal(2),
    )
    record(event_id="d", tenant=other_tenant, occurred_at=AT)

    assert [u.event_id for u in usage_for_tenant(tenant, since=AT)] == ["c", "b"]
    assert usage_totals(tenant, since=AT) == {
        "requests": 2,
        "tokens_in": 30,
        "tokens_out": 12,
        "credits": Decimal(3),
    }
    assert usage_totals(tenant, since=AT + timedelta(days=1)) == {
        "requests": 0,
        "tokens_in": 0,
        "tokens_out": 0,
        "credits": Decimal(0),
    }
