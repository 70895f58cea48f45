"""Retention (real PostgreSQL): old rows go in bounded batches, recent ones stay; the audit log
is archived (gzipped JSON lines) before any row is deleted, its trigger refuses a delete
without the archive step, and a failed archive deletes nothing; bad ages are refused."""

from __future__ import annotations

import gzip
import json
from datetime import timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from apps.billing.models import UsageRecord
from apps.common import tasks
from apps.common.models import AuditEvent
from apps.common.retention import (
    ARCHIVED_THROUGH,
    retention_apply,
    retention_check,
    retention_models,
)
from apps.models.services import pool_create
from apps.scaling.models import ScalingDecision
from apps.tenants.models import Tenant
from apps.tenants.services.tenants import tenant_create

pytestmark = [pytest.mark.db, pytest.mark.django_db]

OLD = timedelta(days=500)


@pytest.fixture
def policy(settings: Any, tmp_path: Path) -> Path:
    """Small batches; every table aged 30-400 days; the archive under ``tmp_path``."""
    settings.RETENTION_BATCH_ROWS = 3
    settings.RETENTION_MAX_BATCHES = 2
    settings.RETENTION_ARCHIVE_DIR = tmp_path / "archive"
    settings.RETENTION_DAYS = {"usage": 400, "audit": 400, "scaling_decisions": 30,
                               "rollout_events": 400, "budget_alerts": 400}  # fmt: skip
    return tmp_path / "archive"


@pytest.fixture
def tenant() -> Tenant:
    return tenant_create(actor=None, slug="keep", name="Keep", rpm_limit=10, tpm_limit=1000,
                         max_concurrency=2, max_context_tokens=100,
                         max_output_tokens=10)  # fmt: skip


def _usage(tenant: Tenant, n: int, age: timedelta, tag: str) -> None:
    when = timezone.now() - age
    UsageRecord.objects.bulk_create(
        UsageRecord(event_id=f"{tag}-{i}", tenant=tenant, request_class="c", tokens_in=1,
                    tokens_out=1, credits=Decimal(1), outcome="ok", occurred_at=when)
        for i in range(n)
    )  # fmt: skip


def _audit(n: int, age: timedelta, action: str) -> list[int]:
    """Audit rows written ``age`` ago (an INSERT: the trigger guards only UPDATE/DELETE)."""
    ids = []
    with connection.cursor() as cursor:
        for i in range(n):
            cursor.execute(
                "INSERT INTO tenants_auditevent (actor_label, action, target_type, target_id,"
                " target_repr, created_at) VALUES ('system', %s, 't', %s, 'r', %s) RETURNING id",
                [action, str(i), timezone.now() - age],
            )
            ids.append(cursor.fetchone()[0])
    return ids


def test_every_growing_table_declares_a_policy() -> None:
    assert sorted(retention_models()) == [
        "audit", "budget_alerts", "rollout_events", "scaling_decisions", "usage"]  # fmt: skip


def test_old_rows_go_in_bounded_batches_and_recent_ones_stay(policy: Path, tenant: Tenant) -> None:
    _usage(tenant, 10, OLD, "old")
    _usage(tenant, 2, timedelta(days=10), "new")
    pool = pool_create(actor=None, name="ret-cpu", hardware_tier="cpu", cost_per_replica_hour=1)
    for _ in range(4):
        ScalingDecision.objects.create(pool=pool, policy="cpu", actuator="local", action="hold",
                                       current=1, desired=1, reason="steady")  # fmt: skip
    ScalingDecision.objects.update(created_at=timezone.now() - timedelta(days=31))
    ScalingDecision.objects.create(pool=pool, policy="cpu", actuator="local", action="hold",
                                   current=1, desired=1, reason="today")  # fmt: skip

    first = {p.policy: p for p in retention_apply()}
    assert (first["usage"].rows, first["usage"].more) == (6, True)  # 2 batches of 3, bounded
    assert (first["scaling_decisions"].rows, first["scaling_decisions"].more) == (4, False)
    assert tasks.retention_apply() == 4  # the Celery task: the rest of the old usage
    assert sorted(UsageRecord.objects.values_list("event_id", flat=True)) == ["new-0", "new-1"]
    assert list(ScalingDecision.objects.values_list("reason", flat=True)) == ["today"]
    purges = AuditEvent.objects.filter(action="retention.purge").order_by("id")
    assert [e.after for e in purges] == [
        {"usage": {"rows": 6, "archives": [], "more": True},
         "scaling_decisions": {"rows": 4, "archives": [], "more": False}},
        {"usage": {"rows": 4, "archives": [], "more": False}},
    ]  # fmt: skip
    assert tasks.retention_apply() == 0
    assert AuditEvent.objects.filter(action="retention.purge").count() == 2  # nothing: no event


def test_the_audit_log_is_archived_before_its_rows_go(policy: Path) -> None:
    old = _audit(5, OLD, "old.change")
    recent = _audit(1, timedelta(days=1), "recent.change")
    done = {p.policy: p for p in retention_apply()}
    assert done["audit"].rows == 5
    files = sorted(policy.glob("audit/*.jsonl.gz"))
    assert [f.name for f in files] == [f"audit-{old[0]}-{old[2]}.jsonl.gz",
                                       f"audit-{old[3]}-{old[4]}.jsonl.gz"]  # fmt: skip
    archived = [
        json.loads(line) for f in files for line in gzip.decompress(f.read_bytes()).splitlines()
    ]
    assert [row["id"] for row in archived] == old
    assert {row["action"] for row in archived} == {"old.change"}
    assert all(row["created_at"] for row in archived)
    assert list(AuditEvent.objects.exclude(action="retention.purge").values_list("id", flat=True)) \
        == recent  # fmt: skip
    event = AuditEvent.objects.get(action="retention.purge")
    assert event.after["audit"]["archives"] == [str(f) for f in files]


def test_the_trigger_refuses_a_delete_of_rows_not_declared_archived() -> None:
    first, second = _audit(2, OLD, "kept.change")

    def delete(row: int, *, declared: int | None = None) -> None:
        with transaction.atomic(), connection.cursor() as cursor:
            if declared is not None:
                cursor.execute("SELECT set_config(%s, %s, true)", [ARCHIVED_THROUGH, str(declared)])
            cursor.execute("DELETE FROM tenants_auditevent WHERE id = %s", [row])

    with pytest.raises(IntegrityError, match="append-only"):
        delete(first)  # nothing declared archived
    with pytest.raises(IntegrityError, match="append-only"):
        delete(second, declared=first)  # a row above what was declared archived
    assert AuditEvent.objects.filter(id__in=[first, second]).count() == 2


def test_a_failed_archive_deletes_nothing(settings: Any, policy: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    settings.RETENTION_ARCHIVE_DIR = blocker
    old = _audit(2, OLD, "old.change")
    with pytest.raises(OSError):  # noqa: PT011 - the file system's own error
        retention_apply()
    assert AuditEvent.objects.filter(id__in=old).count() == 2


def test_ages_zero_keeps_forever_and_too_short_is_refused(
    settings: Any, policy: Path, tenant: Tenant
) -> None:
    _usage(tenant, 2, OLD, "old")
    settings.RETENTION_DAYS = {**django_settings.RETENTION_DAYS, "usage": 0}
    assert "usage" not in {p.policy for p in retention_apply()}
    assert UsageRecord.objects.count() == 2
    settings.RETENTION_DAYS = {**django_settings.RETENTION_DAYS, "usage": 7}
    _audit(1, OLD, "old.change")  # audit sorts before usage: nothing goes, not even that
    with pytest.raises(ImproperlyConfigured, match=r"RETENTION_DAYS\['usage'\] is 7.*32 days"):
        retention_apply()
    assert UsageRecord.objects.count() == 2
    assert AuditEvent.objects.filter(action="old.change").count() == 1
    [error] = retention_check()
    assert error.id == "switchyard.E002"
    assert "RETENTION_DAYS['usage']" in error.msg


def test_beat_runs_the_retention_task() -> None:
    entry = django_settings.CELERY_BEAT_SCHEDULE["apply-retention"]
    assert entry["task"] == "apps.common.tasks.retention_apply"
