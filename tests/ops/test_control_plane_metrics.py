"""The control plane's /metrics reads the background work's signals from the real Redis and
PostgreSQL: the scheduling beat's heartbeat, the usage events not yet in the ledger, the
reconciliation's drift, the snapshot outbox."""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from fixtures.redis_keys import RedisClient
from prometheus_client.parser import text_string_to_metric_families

from apps.billing.drift import reconcile_record
from apps.billing.ledger import Repair
from apps.common.models import SnapshotOutbox
from config.beat_lock import BeatLease
from runtime.contract import USAGE_GROUP, usage_stream

pytestmark = [pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def namespace(settings: Any, key_prefix: str) -> str:
    """The test's own Redis namespace (its keys deleted afterwards) and snapshot prefix."""
    settings.SNAPSHOT_REDIS_PREFIX = f"{key_prefix}:snapshot"
    return key_prefix


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


def test_beat_heartbeat_age(namespace: str, redis_client: RedisClient) -> None:
    assert BeatLease(redis_client, namespace, ttl_s=5.0).hold()
    assert 0 <= scrape()["switchyard_beat_heartbeat_age_seconds"] < 5


def test_usage_events_not_yet_in_the_ledger(namespace: str, redis_client: RedisClient) -> None:
    stream = usage_stream(namespace)
    old_ms = int(time.time() * 1000) - 60_000
    for i in range(3):
        redis_client.xadd(stream, {"e": str(i)}, id=f"{old_ms + i}-0")
    got = scrape()  # no consumer group yet: all three wait
    assert got["switchyard_usage_backlog_events"] == 3
    assert 59 <= got["switchyard_usage_oldest_unledgered_age_seconds"] < 120

    redis_client.xgroup_create(stream, USAGE_GROUP, id="0")
    read = redis_client.xreadgroup(USAGE_GROUP, "c1", {stream: ">"}, count=2)
    assert scrape()["switchyard_usage_backlog_events"] == 3  # 2 pending + 1 undelivered
    first, second = (entry_id for entry_id, _ in read[0][1])
    redis_client.xack(stream, USAGE_GROUP, first, second)
    got = scrape()
    assert got["switchyard_usage_backlog_events"] == 1
    assert 59 <= got["switchyard_usage_oldest_unledgered_age_seconds"] < 120
    redis_client.xreadgroup(USAGE_GROUP, "c1", {stream: ">"}, count=1)
    last = redis_client.xrange(stream, count=3)[-1][0]
    redis_client.xack(stream, USAGE_GROUP, last)
    got = scrape()
    assert got["switchyard_usage_backlog_events"] == 0
    assert got["switchyard_usage_oldest_unledgered_age_seconds"] == 0


def test_reconciliation_drift(namespace: str, redis_client: RedisClient) -> None:
    repairs = [Repair("acme", 100, 2_500_100), Repair("globex", None, 7_000_000)]  # 1 drift
    reconcile_record(client=redis_client, namespace=namespace, repairs=repairs)
    reconcile_record(client=redis_client, namespace=namespace, repairs=[])
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
