"""Celery tasks of the base app: fetch, call a service, nothing else."""

from __future__ import annotations

from celery import shared_task

from apps.common.retention import retention_apply as apply_policies


@shared_task(name="apps.common.tasks.retention_apply", ignore_result=True)
def retention_apply() -> int:
    """Apply the retention policies once, in bounded batches (beat: ``RETENTION_EVERY_S``);
    returns how many rows went."""
    return sum(purged.rows for purged in apply_policies())
