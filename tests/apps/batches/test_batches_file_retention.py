"""Retention per tenant (issue #32 item 6, apps/batches/services/retention.py): a tenant's
``batch_file_retention_days`` has the beat tick purge its files older than that (input,
output, error) through the storage API, audited as ``retention.purge``; an input file stays
while its batch runs; a tenant without the setting keeps everything."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from batch_support import Signed, jsonl, line, make_tenant
from django.core.files.storage import storages
from django.utils import timezone

from apps.batches import executor
from apps.batches.models import Batch, File
from apps.batches.services import (
    batch_finalize,
    files_retention_apply,
    line_record,
    lines_claim,
)
from apps.common.models import AuditEvent
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_update

pytestmark = [pytest.mark.db, pytest.mark.django_db]

Capture = Callable[..., Any]  # pytest-django's django_capture_on_commit_callbacks


def _run(client: Signed, *custom_ids: str) -> Batch:
    uploaded = client.upload(jsonl(*(line(c) for c in custom_ids)))
    assert uploaded.status_code == 200, uploaded.content
    created = client.post_json("/v1/batches", {
        "input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    })  # fmt: skip
    assert created.status_code == 200, created.content
    return Batch.objects.get(public_id=created.json()["id"])


def _age(days: float, *files: File | None) -> None:
    ids = [file.pk for file in files if file is not None]
    File.objects.filter(pk__in=ids).update(created_at=timezone.now() - timedelta(days=days))


def _gone(file: File) -> bool:
    file.refresh_from_db()
    return file.deleted_at is not None and not storages["batches"].exists(file.storage_name)


def test_files_past_the_tenants_period_are_purged_and_audited_others_kept(
    tenant: Tenant, django_capture_on_commit_callbacks: Capture
) -> None:
    kept_tenant = make_tenant("globex")  # no period: kept until deleted
    tenant_update(actor=None, tenant=tenant, batch_file_retention_days=7)
    acme, globex = Signed("acme"), Signed("globex")
    batch, other = _run(acme, "a"), _run(globex, "g")
    assert batch.input_file is not None
    assert other.input_file is not None
    _age(30, batch.input_file, other.input_file)
    with django_capture_on_commit_callbacks(execute=True):
        assert files_retention_apply() == 0  # its batch still runs
    for claimed in lines_claim(owner="w1", limit=10, lease_s=60):
        assert line_record(line_id=claimed.pk, owner="w1", status_code=200, body={"ok": 1},
                           request_id="r")  # fmt: skip
    ended = batch_finalize(batch_id=batch.pk)
    assert ended is not None
    assert ended.output_file is not None
    output = ended.output_file
    _age(6, output)  # within the period
    with django_capture_on_commit_callbacks(execute=True):
        assert files_retention_apply() == 1  # the input, now free
    assert _gone(batch.input_file)
    assert not _gone(output)
    resp = acme.get(f"/v1/files/{batch.input_file.public_id}/content")
    assert (resp.status_code, resp.json()["error"]["code"]) == (404, "file_deleted")
    event = AuditEvent.objects.get(action="retention.purge")
    assert event.after == {"batch_files": {"rows": 1, "files": {"acme": [
        batch.input_file.public_id]}}}  # fmt: skip
    _age(8, output)
    with django_capture_on_commit_callbacks(execute=True):
        # the beat tick applies it: the output, past 7 days
        assert executor.tick("w1")["files_retention_purged"] == 1
    assert _gone(output)
    assert not _gone(other.input_file)  # globex has no period
    assert kept_tenant.batch_file_retention_days is None


def test_the_purge_is_bounded_per_run(
    tenant: Tenant, django_capture_on_commit_callbacks: Capture
) -> None:
    tenant_update(actor=None, tenant=tenant, batch_file_retention_days=1)
    acme = Signed("acme")
    for name in ("a", "b", "c"):
        assert acme.upload(jsonl(line(name))).status_code == 200
    _age(2, *File.objects.all())
    with django_capture_on_commit_callbacks(execute=True):
        assert files_retention_apply(limit=2) == 2
        assert files_retention_apply(limit=2) == 1
        assert files_retention_apply(limit=2) == 0
    assert File.objects.filter(deleted_at__isnull=True).count() == 0
