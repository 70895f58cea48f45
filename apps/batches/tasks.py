"""Celery tasks of the Batch API: the executor's beat tick, the lost-usage repair."""

from __future__ import annotations

import os
import socket
import uuid

from celery import shared_task

from apps.batches import executor
from apps.batches.services.unbilled import lines_bill_missing


@shared_task(ignore_result=True)
def batches_tick() -> dict[str, int]:
    """Finalize what can end, run claimed lines (apps/batches/executor.py)."""
    owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return executor.tick(owner)


@shared_task(ignore_result=True)
def batch_lines_bill() -> int:
    """Charge the done lines whose usage event was lost (apps/batches/services/unbilled.py;
    beat: every SWITCHYARD_BATCH_BILL_EVERY_S); how many."""
    return len(lines_bill_missing())
