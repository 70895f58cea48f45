"""The Batch API's files are encrypted at rest (apps/batches/sealing.py): the storage holds no
plaintext of an input or output file, the API reads them back as they were, a stored file
does not open under another tenant's or another file's name, and the keyring rotates
(a re-seal moves every file to the new key before the old one leaves the ring)."""

from __future__ import annotations

from typing import Any

import pytest
from batch_support import KEY_1, KEY_2, Signed, jsonl, line, make_tenant
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.core.management import call_command

from apps.batches.models import File
from apps.batches.services import file_read
from apps.batches.services.files import STORAGE, file_raw, files_reseal, store
from apps.tenants.models import Tenant
from runtime.crypto import MAGIC, Keyring

pytestmark = [pytest.mark.db, pytest.mark.django_db]

SECRET_WORDS = "the-launch-code-is-4217"


def _upload(acme: Signed, *custom_ids: str) -> dict[str, Any]:
    resp = acme.upload(jsonl(*(
        line(c, messages=[{"role": "user", "content": f"{SECRET_WORDS} {c}"}])
        for c in custom_ids
    )))  # fmt: skip
    assert resp.status_code == 200, resp.content
    data: dict[str, Any] = resp.json()
    return data


def test_the_storage_holds_no_plaintext_and_the_api_reads_it_back(tenant: Tenant) -> None:
    acme = Signed("acme")
    uploaded = _upload(acme, "first", "second")
    file = File.objects.get(public_id=uploaded["id"])
    with storages[STORAGE].open(file.storage_name, "rb") as handle:
        raw = handle.read()
    assert raw.startswith(MAGIC)
    for plain in (SECRET_WORDS.encode(), b"first", b"custom_id", b"messages"):
        assert plain not in raw
    content = acme.get(f"/v1/files/{uploaded['id']}/content")
    assert content.status_code == 200
    assert SECRET_WORDS.encode() in content.content
    assert content.content.count(b"\n") == 2
    assert uploaded["bytes"] == len(content.content)  # the plaintext's size, not the stored one

    output = store(tenant=tenant, purpose=File.Purpose.BATCH_OUTPUT, filename="out.jsonl",
                   content=b'{"custom_id": "first", "answer": "secret"}\n', lines=1)  # fmt: skip
    assert b"secret" not in file_raw(output)  # what a batch writes is sealed the same way
    assert file_read(output) == b'{"custom_id": "first", "answer": "secret"}\n'


def test_a_file_moved_to_another_tenant_or_file_does_not_open(tenant: Tenant) -> None:
    make_tenant("other")
    mine = File.objects.get(public_id=_upload(Signed("acme"), "a")["id"])
    theirs = File.objects.get(public_id=_upload(Signed("other"), "b")["id"])
    # Their stored bytes swapped in under my file's name: the tenant (scope) and the file id
    # (associated data) both differ, so it does not decrypt.
    storages[STORAGE].delete(mine.storage_name)
    storages[STORAGE].save(mine.storage_name, ContentFile(file_raw(theirs)))
    resp = Signed("acme").get(f"/v1/files/{mine.public_id}/content")
    assert resp.status_code == 500
    error = resp.json()["error"]
    assert (error["code"], error["type"]) == ("file_unreadable", "server_error")
    assert Signed("other").get(f"/v1/files/{theirs.public_id}/content").status_code == 200


def test_rotation_reseal_then_drop_the_old_key(tenant: Tenant, settings: Any) -> None:
    acme = Signed("acme")
    old = File.objects.get(public_id=_upload(acme, "a")["id"])
    legacy = File.objects.create(
        public_id="file-legacy", tenant=tenant, purpose=File.Purpose.BATCH, filename="l.jsonl",
        bytes=5, lines=1, storage_name=storages[STORAGE].save("acme/l.jsonl",
                                                              ContentFile(b"plain")),
    )  # fmt: skip
    assert file_read(legacy) == b"plain"  # stored before encryption: read as it is

    settings.AT_REST_KEYS = f"{KEY_2},{KEY_1}"  # a new primary key; the old one still opens
    assert SECRET_WORDS.encode() in acme.get(f"/v1/files/{old.public_id}/content").content
    settings.AT_REST_KEYS = KEY_2  # dropped too early: the old file no longer opens
    assert acme.get(f"/v1/files/{old.public_id}/content").status_code == 500

    settings.AT_REST_KEYS = f"{KEY_2},{KEY_1}"
    assert files_reseal() == 2  # the k1 file and the plaintext one
    call_command("batch_files_reseal")  # nothing left: idempotent
    ring = Keyring.from_spec(KEY_2)
    for file in (old, legacy):
        file.refresh_from_db()
        assert not ring.stale(file_raw(file))
    settings.AT_REST_KEYS = KEY_2  # the old key can go now
    assert SECRET_WORDS.encode() in acme.get(f"/v1/files/{old.public_id}/content").content
    assert file_read(legacy) == b"plain"
    assert b"plain" not in file_raw(legacy)
