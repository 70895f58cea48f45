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

Retention per tenant: a tenant with ``batch_file_retention_days`` set has each of its files
(input, output, error) purged the same way once it is older than that many days
(:func:`files_retention_apply`, on the batch executor's beat tick, bounded per run; audited
as the retention service does, a ``retention.purge`` event naming the files). An input file
stays while a batch reading it has not ended. Zero retention still wins: its files go sooner.
Other tenants' files are kept until they delete them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.core.files.storage import storages
from django.db import transaction
from django.utils import timezone

from apps.batches.models import Batch, BatchLine, File
from apps.batches.services.files import STORAGE
from apps.common.audit import SYSTEM_ACTOR_LABEL
from apps.common.models import AuditEvent
from apps.tenants.models import Tenant

EXPIRE_BATCH_ROWS = 500  # files purged per tick at most; the next tick takes the rest
_NOT_ENDED = (Batch.Status.VALIDATING, Batch.Status.IN_PROGRESS, Batch.Status.FINALIZING,
              Batch.Status.CANCELLING)  # fmt: skip


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


def files_retention_apply(*, now: datetime | None = None, limit: int = EXPIRE_BATCH_ROWS) -> int:
    """Purge the files older than their tenant's ``batch_file_retention_days`` (at most
    ``limit``; an input file of a batch that has not ended stays); how many. A run that
    purged something records a ``retention.purge`` audit event with the files by tenant."""
    now = now or timezone.now()
    in_use = Batch.objects.filter(status__in=_NOT_ENDED, input_file__isnull=False)
    purged: dict[str, list[str]] = {}
    left = limit
    with transaction.atomic():
        tenants = Tenant.objects.filter(batch_file_retention_days__isnull=False).order_by("pk")
        for tenant in tenants:
            if left <= 0:
                break
            cutoff = now - timedelta(days=tenant.batch_file_retention_days or 0)
            due = list(
                File.objects.select_for_update(skip_locked=True)
                .filter(tenant=tenant, deleted_at__isnull=True, created_at__lt=cutoff)
                .exclude(pk__in=in_use.values("input_file"))
                .order_by("created_at")[:left]
            )
            for file in due:
                file_purge(file)
            if due:
                purged[tenant.slug] = [file.public_id for file in due]
                left -= len(due)
        if purged:
            AuditEvent.objects.create(
                actor_label=SYSTEM_ACTOR_LABEL, action="retention.purge",
                target_type="retention", target_id="", target_repr="batch files",
                after={"batch_files": {"rows": limit - left, "files": purged}},
            )  # fmt: skip
    return limit - left
