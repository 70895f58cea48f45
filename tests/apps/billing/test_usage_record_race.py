"""Two consumers writing the same usage event at once: one row, one of them created it."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import pytest
from django.db import connections, transaction
from fixtures.db_locks import wait_for_blocked_insert

from apps.billing.models import UsageRecord
from apps.billing.services import usage_record_create

pytestmark = [pytest.mark.db, pytest.mark.django_db(transaction=True)]


def test_concurrent_replay_writes_one_row(tenant):
    values = {
        "event_id": "evt-race",
        "tenant": tenant,
        "request_class": "standard",
        "tokens_in": 1,
        "tokens_out": 1,
        "credits": 1,
        "cached": False,
        "outcome": "ok",
        "occurred_at": datetime(2026, 11, 1, tzinfo=UTC),
    }
    outcome: dict[str, object] = {}

    def second() -> None:
        try:
            outcome["result"] = usage_record_create(**values)
        finally:
            connections.close_all()

    with transaction.atomic():
        first, created = usage_record_create(**values)
        thread = threading.Thread(target=second)
        thread.start()
        wait_for_blocked_insert("billing_usagerecord")
    thread.join(timeout=10)

    record, created_again = outcome["result"]
    assert created
    assert not created_again
    assert record.pk == first.pk
    assert UsageRecord.objects.count() == 1
