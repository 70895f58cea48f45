"""The Batch API's files in an S3-compatible store (``SWITCHYARD_BATCH_STORAGE=s3://...``,
config/batch_storage.py, django-storages' S3Storage), against moto's real S3 HTTP server on
127.0.0.1 (no AWS): a file uploaded through the API the router forwards to is one object under
the configured prefix, holding ciphertext only; it reads back as it was; deleting the file
deletes the object; the tenant's retention period purges expired objects; a re-seal rewrites
the object in place."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from batch_support import KEY_1, KEY_2, Signed, jsonl, line
from fixtures.s3_server import S3Bucket, s3_bucket

from apps.batches.models import File
from apps.batches.services import files_retention_apply
from apps.batches.services.files import files_reseal
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_update
from config.batch_storage import S3_BACKEND, BatchStorageError, batch_storage, from_env
from runtime.crypto import MAGIC, Keyring

pytestmark = [pytest.mark.db, pytest.mark.integration, pytest.mark.django_db]

BUCKET = "switchyard-batch-files"
PREFIX = "prod/batches"
WORDS = b"the-launch-code-is-4217"
Capture = Callable[..., Any]  # pytest-django's django_capture_on_commit_callbacks


@pytest.fixture
def bucket(settings: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[S3Bucket]:
    """moto's S3 server with an empty bucket; the settings' ``batches`` storage is what
    ``SWITCHYARD_BATCH_STORAGE=s3://BUCKET/PREFIX/`` and its endpoint make of it."""
    with s3_bucket(BUCKET) as s3:
        env = s3.env(PREFIX + "/")
        for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():  # boto3's own chain reads the credentials
            monkeypatch.setenv(name, value)
        settings.STORAGES = {**settings.STORAGES,
                             "batches": from_env(env, Path("/nonexistent"))}  # fmt: skip
        yield s3


def _upload(client: Signed, *custom_ids: str) -> File:
    resp = client.upload(jsonl(*(
        line(c, messages=[{"role": "user", "content": f"{WORDS.decode()} {c}"}])
        for c in custom_ids
    )))  # fmt: skip
    assert resp.status_code == 200, resp.content
    return File.objects.get(public_id=resp.json()["id"])


def test_upload_read_and_delete_through_the_api_hold_only_ciphertext_in_the_bucket(
    tenant: Tenant, bucket: S3Bucket, django_capture_on_commit_callbacks: Capture
) -> None:
    acme = Signed("acme")
    file = _upload(acme, "first", "second")
    key = f"{PREFIX}/acme/{file.public_id}.jsonl"
    assert bucket.keys() == [key]
    stored = bucket.object(key)
    assert stored.startswith(MAGIC)  # sealed (apps/batches/sealing.py) before it left
    for plain in (WORDS, b"custom_id", b"first", b"messages"):
        assert plain not in stored
    content = acme.get(f"/v1/files/{file.public_id}/content")
    assert content.status_code == 200
    assert WORDS in content.content
    assert content.content.count(b"\n") == 2

    with django_capture_on_commit_callbacks(execute=True):
        deleted = acme.delete(f"/v1/files/{file.public_id}")
    assert deleted.status_code == 200, deleted.content
    assert deleted.json()["deleted"] is True
    assert bucket.keys() == []
    assert acme.get(f"/v1/files/{file.public_id}").status_code == 404


def test_retention_purges_expired_objects_and_a_reseal_rewrites_in_place(
    tenant: Tenant, bucket: S3Bucket, settings: Any, django_capture_on_commit_callbacks: Capture
) -> None:
    tenant_update(actor=None, tenant=tenant, batch_file_retention_days=7)
    acme = Signed("acme")
    old, recent = _upload(acme, "old"), _upload(acme, "recent")
    File.objects.filter(pk=old.pk).update(created_at=old.created_at - timedelta(days=8))
    with django_capture_on_commit_callbacks(execute=True):
        assert files_retention_apply() == 1
    assert bucket.keys() == [f"{PREFIX}/acme/{recent.public_id}.jsonl"]
    assert acme.get(f"/v1/files/{old.public_id}/content").status_code == 404

    settings.AT_REST_KEYS = f"{KEY_2},{KEY_1}"  # a new primary key: the re-seal moves to it
    assert files_reseal() == 1
    recent.refresh_from_db()
    key = f"{PREFIX}/{recent.storage_name}"
    assert bucket.keys() == [key]  # the same object, rewritten
    assert not Keyring.from_spec(KEY_2).stale(bucket.object(key))
    settings.AT_REST_KEYS = KEY_2
    assert WORDS in acme.get(f"/v1/files/{recent.public_id}/content").content


def test_the_setting_names_a_bucket_and_prefix_or_is_refused() -> None:
    local = batch_storage("", Path("/srv/var"))
    assert local["OPTIONS"] == {"location": "/srv/var/batch-files"}
    s3 = batch_storage("s3://bucket/a/b/", Path("/srv/var"), endpoint_url="http://minio:9000")
    assert s3["BACKEND"] == S3_BACKEND
    options = s3["OPTIONS"]
    assert (options["bucket_name"], options["location"]) == ("bucket", "a/b")
    assert (options["endpoint_url"], options["addressing_style"]) == ("http://minio:9000", "path")
    assert "region_name" not in options
    for bad in ("gs://bucket", "s3://", "/var/files", "s3://bucket?x=1"):
        with pytest.raises(BatchStorageError):
            batch_storage(bad, Path("/srv/var"))
