"""Celery tasks of the Batch API: the executor's beat tick."""

from __future__ import annotations

import os
import socket
import uuid

from celery import shared_task

from apps.batches import executor


@shared_task(ignore_result=True)
def batches_tick() -> dict[str, int]:
    """Finalize what can end, run claimed lines (apps/batches/executor.py)."""
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return executor.tick(owner)
