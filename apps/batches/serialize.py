"""The Batch API's objects in OpenAI's shapes."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from apps.batches.models import Batch, File


def _ts(when: datetime | None) -> int | None:
    return None if when is None else int(when.timestamp())


def file_object(file: File) -> dict[str, Any]:
    return {
        "id": file.public_id,
        "object": "file",
        "bytes": file.bytes,
        "created_at": _ts(file.created_at),
        "filename": file.filename,
        "purpose": file.purpose,
        "status": "processed",
        "status_details": None,
    }


def _public(file: File | None) -> str | None:
    return None if file is None else file.public_id


def batch_object(batch: Batch) -> dict[str, Any]:
    return {
        "id": batch.public_id,
        "object": "batch",
        "endpoint": batch.endpoint,
        "errors": batch.errors,
        "input_file_id": _public(batch.input_file),
        "completion_window": batch.completion_window,
        "status": batch.status,
        "output_file_id": _public(batch.output_file),
        "error_file_id": _public(batch.error_file),
        "created_at": _ts(batch.created_at),
        "in_progress_at": _ts(batch.in_progress_at),
        "expires_at": _ts(batch.expires_at),
        "finalizing_at": _ts(batch.finalizing_at),
        "completed_at": _ts(batch.completed_at),
        "failed_at": _ts(batch.failed_at),
        "expired_at": _ts(batch.expired_at),
        "cancelling_at": _ts(batch.cancelling_at),
        "cancelled_at": _ts(batch.cancelled_at),
        "request_counts": {
            "total": batch.total,
            "completed": batch.completed,
            "failed": batch.failed,
        },
        "metadata": batch.metadata,
    }
