"""Zero retention for batch jobs (issue #31): a ``zero_retention`` tenant's batch files exist
only while they are needed.

- When a batch ends (completed, failed, expired, cancelled: :func:`batch_forget`, called by
  ``batch_finalize`` in its transaction), its input file's bytes are deleted (the File row
  stays, marked ``deleted_at``, so the batch still names it) and its lines' request bodies,
  answers and errors in PostgreSQL are cleared; the output and error files get an
  ``expires_at`` (``BATCH_ZERO_RETENTION_OUTPUT_S`` after the end).
- An output or error file is deleted once it has been downloaded (:func:`file_downloaded`,
  after the content is read) or, unread, when it expires (:func:`files_expire`, on the batch
  executor's beat tick).

Other tenants' files are kept until they delete them.
"""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.core.files.storage import storages
from django.db import transaction
from django.utils import timezone

from apps.batches.models import Batch, BatchLine, File
from apps.batches.services.files import STORAGE

EXPIRE_BATCH_ROWS = 500  # files purged per tick at most; the next tick takes the rest


def file_purge(file: File) -> None:
    """Delete a file's bytes (after the commit) and mark its row deleted."""
    if file.deleted_at is not None:
        return
    name = file.storage_name
    file.deleted_at = timezone.now()
    file.expires_at = None
    file.save(update_fields=["deleted_at", "expires_at"])
    transaction.on_commit(lambda: storages[STORAGE].delete(name))


def batch_forget(batch: Batch) -> None:
    """A zero_retention tenant's batch has ended: drop what it no longer needs."""
    if not batch.tenant.zero_retention:
        return
    BatchLine.objects.filter(batch=batch).update(body={}, response=None, error=None)
    if batch.input_file is not None:
        file_purge(batch.input_file)
    expires_at = timezone.now() + timedelta(seconds=settings.BATCH_ZERO_RETENTION_OUTPUT_S)
    for file in (batch.output_file, batch.error_file):
        if file is not None:
            file.expires_at = expires_at
            file.save(update_fields=["expires_at"])


def file_downloaded(file: File) -> None:
    """A file's content was sent: a zero_retention tenant's batch output goes now."""
    if file.purpose == File.Purpose.BATCH_OUTPUT and file.tenant.zero_retention:
        with transaction.atomic():
            file_purge(file)


def files_expire(limit: int = EXPIRE_BATCH_ROWS) -> int:
    """Purge the files whose ``expires_at`` has passed (at most ``limit``); how many."""
    with transaction.atomic():
        due = list(
            File.objects.select_for_update(skip_locked=True)
            .filter(deleted_at__isnull=True, expires_at__lte=timezone.now())
            .order_by("expires_at")[:limit]
        )
        for file in due:
            file_purge(file)
    return len(due)
