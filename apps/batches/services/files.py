"""Batch API files: upload (checked line by line), read, delete. Stored through Django's
storage API (the ``batches`` entry of ``STORAGES``: local files under the var directory by
default, any other backend, e.g. S3 through django-storages, by configuration), encrypted
per tenant (:mod:`apps.batches.sealing`): the storage never holds a file's plaintext."""

from __future__ import annotations

import json
import secrets
from typing import Any

from django.conf import settings
from django.core.files.base import ContentFile
from django.core.files.storage import storages
from django.db import transaction

from apps.batches import sealing
from apps.batches.errors import BatchApiError
from apps.batches.models import File
from apps.tenants.models import Tenant
from runtime.crypto import KeyringError, SealError

ENDPOINTS = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
STORAGE = "batches"


def new_id(prefix: str) -> str:
    return prefix + secrets.token_hex(12)


def parse_line(raw: bytes, number: int) -> dict[str, Any]:
    """One input line as OpenAI's batch format has it, or a 400 naming the line."""

    def bad(reason: str) -> BatchApiError:
        return BatchApiError(400, "invalid_jsonl", f"Line {number}: {reason}.", line=number)

    try:
        item = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise bad(f"not valid JSON ({exc})") from None
    if not isinstance(item, dict):
        raise bad("not a JSON object")
    custom_id = item.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > 512:
        raise bad("'custom_id' must be a string of 1 to 512 characters")
    if item.get("method") != "POST":
        raise bad("'method' must be 'POST'")
    if item.get("url") not in ENDPOINTS:
        raise bad(f"'url' must be one of {', '.join(ENDPOINTS)}")
    if not isinstance(item.get("body"), dict):
        raise bad("'body' must be a JSON object")
    return item


def split_lines(content: bytes) -> list[tuple[int, bytes]]:
    """The non-blank lines with their 1-based numbers."""
    return [(i, raw) for i, raw in enumerate(content.split(b"\n"), start=1) if raw.strip()]


def file_create(*, tenant: Tenant, purpose: str, filename: str, content: bytes) -> File:
    """Check and store an upload: purpose ``batch``, within the size and line caps, every
    line a request in OpenAI's batch format (the first bad one is refused with its number)."""
    if purpose != File.Purpose.BATCH:
        raise BatchApiError(
            400, "invalid_purpose", "Only purpose 'batch' can be uploaded.", param="purpose"
        )
    cap = settings.BATCH_MAX_FILE_BYTES
    if len(content) > cap:
        raise BatchApiError(413, "file_too_large", f"The file is over {cap} bytes.", param="file")
    lines = split_lines(content)
    if not lines:
        raise BatchApiError(400, "empty_file", "The file holds no request.", param="file")
    if len(lines) > settings.BATCH_MAX_LINES:
        raise BatchApiError(
            400, "too_many_lines",
            f"The file holds {len(lines)} requests; at most {settings.BATCH_MAX_LINES} are "
            "allowed.", param="file",
        )  # fmt: skip
    for number, raw in lines:
        parse_line(raw, number)
    return store(
        tenant=tenant, purpose=File.Purpose.BATCH, filename=filename[:255] or "input.jsonl",
        content=content, lines=len(lines),
    )  # fmt: skip


def store(*, tenant: Tenant, purpose: str, filename: str, content: bytes, lines: int) -> File:
    """Save ``content`` sealed for the tenant; ``bytes`` is the plaintext's size."""
    public_id = new_id("file-")
    sealed = sealing.seal(content, tenant=tenant.slug, file_id=public_id)
    name = storages[STORAGE].save(f"{tenant.slug}/{public_id}.jsonl", ContentFile(sealed))
    return File.objects.create(
        public_id=public_id, tenant=tenant, purpose=purpose, filename=filename,
        bytes=len(content), lines=lines, storage_name=name,
    )  # fmt: skip


def file_raw(file: File) -> bytes:
    """The stored bytes as they are (sealed)."""
    with storages[STORAGE].open(file.storage_name, "rb") as handle:
        data: bytes = handle.read()
    return data


def file_read(file: File) -> bytes:
    """The file's plaintext; a 500 ``file_unreadable`` when its key left the keyring or the
    stored bytes were altered."""
    try:
        return sealing.unseal(file_raw(file), tenant=file.tenant.slug, file_id=file.public_id)
    except (SealError, KeyringError) as exc:
        raise BatchApiError(
            500, "file_unreadable",
            f"The file '{file.public_id}' cannot be decrypted ({exc}); ask the operator.",
        ) from None  # fmt: skip


def file_delete(file: File) -> None:
    name = file.storage_name
    with transaction.atomic():
        file.delete()
        transaction.on_commit(lambda: storages[STORAGE].delete(name))


def files_reseal() -> int:
    """Re-seal with the primary key every stored file sealed with an older one (or stored
    before encryption), so the old key can leave the keyring; how many were rewritten."""
    ring = sealing.keyring()
    done = 0
    for file in File.objects.filter(deleted_at__isnull=True).select_related("tenant"):
        stored = file_raw(file)
        if not sealing.stale(stored, ring):
            continue
        tenant, file_id = file.tenant.slug, file.public_id
        plain = sealing.unseal(stored, tenant=tenant, file_id=file_id, ring=ring)
        sealed = sealing.seal(plain, tenant=tenant, file_id=file_id, ring=ring)
        old = file.storage_name
        file.storage_name = storages[STORAGE].save(f"{tenant}/{file_id}.jsonl", ContentFile(sealed))
        file.save(update_fields=["storage_name"])
        if old != file.storage_name:
            storages[STORAGE].delete(old)
        done += 1
    return done
