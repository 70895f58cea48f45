"""The Batch API's business rules: files, batches, and the executor's claims and answers."""

from apps.batches.services.batches import batch_cancel, batch_create, batch_expire_due
from apps.batches.services.files import file_create, file_delete, file_read
from apps.batches.services.lines import (
    batch_finalize,
    line_record,
    lines_claim,
)
from apps.batches.services.retention import file_downloaded, files_expire, files_retention_apply

__all__ = [
    "batch_cancel",
    "batch_create",
    "batch_expire_due",
    "batch_finalize",
    "file_create",
    "file_delete",
    "file_downloaded",
    "file_read",
    "files_expire",
    "files_retention_apply",
    "line_record",
    "lines_claim",
]
