"""The control plane's /metrics reads the background work's signals from the real Redis and
PostgreSQL: the scheduling beat's heartbeat, the usage events not yet in the ledger, the
reconciliation's drift, the snapshot outbox."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.test import Client
from prometheus_client.parser import text_string_to_metric_families

from apps.billing.drift import reconcile_record
from apps.billing.ledger import Repair
from apps.common.models import SnapshotOutbox
from config.beat_lock import BeatLease
from runtime.contract import USAGE_GROUP, usage_stream

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def namespace(settings: Any) -> Iterator[str]:
    ns = f"switchyard:test:opsmetrics:{uuid.uuid4().hex[:10]}"
    settings.SNAPSHOT_REDIS_PREFIX = f"{ns}:snapshot"
    yield ns
    client: redis.Redis[bytes] = redis.Redis.from_url(django_settings.REDIS_URL)
    for key in client.scan_iter(f"{ns}:*"):
        client.delete(key)
    client.close()


@pytest.fixture
def client() -> Iterator[redis.Redis[bytes]]:
    c: redis.Redis[bytes] = redis.Redis.from_url(django_settings.REDIS_URL)
    yield c
    c.close()


def scrape() -> dict[str, float]:
    response = Client().get("/metrics")
    assert response.status_code == 200
    values = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            key = sample.name + "".join(f"{{{v}}}" for v in sample.labels.values())
            values[key] = sample.value
    return values


def test_a_fresh_deployment_says_beat_and_reconciliation_never_ran(namespace: str) -> None:
    got = scrape()
    assert got["switchyard_control_source_up{redis}"] == 1
    assert got["switchyard_control_source_up{postgres}"] == 1
    assert got["switchyard_beat_heartbeat_age_seconds"] == float("inf")
    assert got["switchyard_credit_reconcile_last_run_age_seconds"] == float("inf")
    assert got["switchyard_usage_backlog_events"] == 0
    assert got["switchyard_usage_oldest_unledgered_age_seconds"] == 0
    assert got["switchyard_snapshot_outbox_pending"] == 0


def test_beat_heartbeat_age(namespace: str, client: redis.Redis[bytes]) -> None:
    assert BeatLease(client, namespace, ttl_s=5.0).hold()
    assert 0 <= scrape()["switchyard_beat_heartbeat_age_seconds"] < 5


def test_usage_events_not_yet_in_the_ledger(namespace: str, client: redis.Redis[bytes]) -> None:
    stream = usage_stream(namespace)
    old_ms = int(time.time() * 1000) - 60_000
    for i in range(3):
        client.xadd(stream, {"e": str(i)}, id=f"{old_ms + i}-0")
    got = scrape()  # no consumer group yet: all three wait
    assert got["switchyard_usage_backlog_events"] == 3
    assert 59 <= got["switchyard_usage_oldest_unledgered_age_seconds"] < 120

    client.xgroup_create(stream, USAGE_GROUP, id="0")
    read = client.xreadgroup(USAGE_GROUP, "c1", {stream: ">"}, count=2)
    assert scrape()["switchyard_usage_backlog_events"] == 3  # 2 pending + 1 undelivered
    first, second = (entry_id for entry_id, _ in read[0][1])
    client.xack(stream, USAGE_GROUP, first, second)
    got = scrape()
    assert got["switchyard_usage_backlog_events"] == 1
    assert 59 <= got["switchyard_usage_oldest_unledgered_age_seconds"] < 120
    client.xreadgroup(USAGE_GROUP, "c1", {stream: ">"}, count=1)
    last = client.xrange(stream, count=3)[-1][0]
    client.xack(stream, USAGE_GROUP, last)
    got = scrape()
    assert got["switchyard_usage_backlog_events"] == 0
    assert got["switchyard_usage_oldest_unledgered_age_seconds"] == 0


def test_reconciliation_drift(namespace: str, client: redis.Redis[bytes]) -> None:
    repairs = [Repair("acme", 100, 2_500_100), Repair("globex", None, 7_000_000)]  # 1 drift
    reconcile_record(client=client, namespace=namespace, repairs=repairs)
    reconcile_record(client=client, namespace=namespace, repairs=[])
    got = scrape()
    assert got["switchyard_credit_reconcile_repairs_total"] == 1
    assert got["switchyard_credit_reconcile_drift_credits_total"] == pytest.approx(2.5)
    assert 0 <= got["switchyard_credit_reconcile_last_run_age_seconds"] < 5


def test_snapshot_outbox_age(namespace: str) -> None:
    row = SnapshotOutbox.objects.create(reason="test")
    aged = row.created_at - timedelta(seconds=90)
    SnapshotOutbox.objects.filter(pk=row.pk).update(created_at=aged)
    got = scrape()
    assert got["switchyard_snapshot_outbox_pending"] == 1
    assert 90 <= got["switchyard_snapshot_outbox_oldest_age_seconds"] < 150
