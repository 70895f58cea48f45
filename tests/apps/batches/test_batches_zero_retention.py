"""Zero retention for batch jobs (issue #31, apps/batches/services/retention.py): a
zero_retention tenant's input file is deleted when its batch ends (completed, cancelled,
expired), the lines' bodies and answers in PostgreSQL are cleared, and the output and error
files are deleted once downloaded or, unread, when their window passes. Other tenants keep
everything."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from batch_support import Signed, jsonl, line, make_tenant
from django.core.files.storage import storages
from django.utils import timezone

from apps.batches import executor
from apps.batches.models import Batch, BatchLine, File
from apps.batches.services import batch_cancel, batch_finalize, line_record, lines_claim
from apps.tenants.models import Tenant

pytestmark = [pytest.mark.db, pytest.mark.django_db]

Capture = Callable[..., Any]  # pytest-django's django_capture_on_commit_callbacks
WINDOW_S = 600.0


@pytest.fixture
def private(tenant: Tenant, settings: Any) -> Signed:
    """A zero_retention tenant (the conftest's ``tenant`` registers the model)."""
    settings.BATCH_ZERO_RETENTION_OUTPUT_S = WINDOW_S
    make_tenant("private", zero_retention=True)
    return Signed("private")


def _start(client: Signed, *custom_ids: str) -> Batch:
    uploaded = client.upload(jsonl(*(line(c) for c in custom_ids)))
    assert uploaded.status_code == 200, uploaded.content
    created = client.post_json("/v1/batches", {
        "input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    })  # fmt: skip
    assert created.status_code == 200, created.content
    return Batch.objects.select_related("input_file").get(public_id=created.json()["id"])


def _answer_all(batch: Batch) -> None:
    for claimed in lines_claim(owner="w1", limit=100, lease_s=60):
        body = {"choices": [{"message": {"content": f"answer {claimed.custom_id}"}}]}
        assert line_record(line_id=claimed.pk, owner="w1", status_code=200, body=body,
                           request_id="r")  # fmt: skip


def _stored(file: File) -> bool:
    return bool(storages["batches"].exists(file.storage_name))


def _code(resp: Any) -> str:
    code: str = resp.json()["error"]["code"]
    return code


def _assert_input_gone(client: Signed, batch: Batch) -> None:
    file = File.objects.get(pk=batch.input_file_id)
    assert file.deleted_at is not None
    assert not _stored(file)
    resp = client.get(f"/v1/files/{file.public_id}/content")
    assert (resp.status_code, _code(resp)) == (404, "file_deleted")
    assert file.public_id not in [f["id"] for f in client.get("/v1/files").json()["data"]]
    kept = list(BatchLine.objects.filter(batch=batch).values_list("body", "response", "error"))
    assert kept == [({}, None, None)] * 2  # no prompt, answer or error left in PostgreSQL


def test_a_completed_batch_drops_its_input_and_lines_and_its_output_goes_once_read(
    private: Signed, django_capture_on_commit_callbacks: Capture
) -> None:
    batch = _start(private, "a", "b")
    assert _stored(batch.input_file)  # the input exists while the batch runs
    _answer_all(batch)
    with django_capture_on_commit_callbacks(execute=True):
        ended = batch_finalize(batch_id=batch.pk)
    assert ended is not None
    assert ended.status == "completed"
    _assert_input_gone(private, batch)
    assert ended.output_file is not None
    output = File.objects.get(pk=ended.output_file.pk)
    assert output.expires_at is not None
    left = (output.expires_at - timezone.now()).total_seconds()
    assert WINDOW_S - 60 < left <= WINDOW_S
    path = f"/v1/files/{output.public_id}/content"
    with django_capture_on_commit_callbacks(execute=True):
        first = private.get(path)
    assert first.status_code == 200
    answers = [json.loads(x)["response"]["body"] for x in first.content.splitlines()]
    assert [a["choices"][0]["message"]["content"] for a in answers] == ["answer a", "answer b"]
    assert not _stored(output)  # downloaded once: deleted
    again = private.get(path)
    assert (again.status_code, _code(again)) == (404, "file_deleted")
    detail = private.get(f"/v1/files/{output.public_id}")
    assert (detail.status_code, _code(detail)) == (404, "file_deleted")
    # The batch still names its files; deleting the deleted row is allowed.
    shown = private.get(f"/v1/batches/{batch.public_id}").json()
    assert shown["output_file_id"] == output.public_id
    assert private.delete(f"/v1/files/{output.public_id}").json()["deleted"] is True


@pytest.mark.parametrize("ending", ["cancelled", "expired"])
def test_a_cancelled_or_expired_batch_drops_its_input_and_the_unread_error_file_expires(
    private: Signed, django_capture_on_commit_callbacks: Capture, ending: str
) -> None:
    batch = _start(private, "a", "b")
    with django_capture_on_commit_callbacks(execute=True):
        if ending == "cancelled":
            batch_cancel(batch=batch)
            ended = batch_finalize(batch_id=batch.pk)
        else:
            ended = batch_finalize(batch_id=batch.pk, expired=True)
    assert ended is not None
    assert ended.status == ending
    _assert_input_gone(private, batch)
    assert ended.error_file is not None
    error_file = File.objects.get(pk=ended.error_file.pk)
    assert _stored(error_file)  # kept for its window, to be downloaded
    with django_capture_on_commit_callbacks(execute=True):
        assert executor.tick("w1")["files_expired"] == 0  # its window is still open
        File.objects.filter(pk=error_file.pk).update(expires_at=timezone.now() - timedelta(1))
        assert executor.tick("w1")["files_expired"] == 1  # the beat tick purges it
    error_file.refresh_from_db()
    assert error_file.deleted_at is not None
    assert not _stored(error_file)
    resp = private.get(f"/v1/files/{error_file.public_id}/content")
    assert (resp.status_code, _code(resp)) == (404, "file_deleted")


def test_other_tenants_keep_their_files_and_lines(
    tenant: Tenant, django_capture_on_commit_callbacks: Capture
) -> None:
    acme = Signed("acme")
    batch = _start(acme, "a")
    _answer_all(batch)
    with django_capture_on_commit_callbacks(execute=True):
        ended = batch_finalize(batch_id=batch.pk)
        assert ended is not None
        assert ended.output_file is not None
        path = f"/v1/files/{ended.output_file.public_id}/content"
        assert acme.get(path).content == acme.get(path).content  # read twice
        assert executor.tick("w1")["files_expired"] == 0
    assert _stored(batch.input_file)
    assert File.objects.filter(deleted_at__isnull=False).count() == 0
    assert File.objects.filter(expires_at__isnull=False).count() == 0
    assert BatchLine.objects.get(batch=batch).body["messages"][0]["content"] == "a"
