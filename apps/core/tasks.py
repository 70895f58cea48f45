"""Celery tasks of the platform core: fetch, call a service, nothing else."""

from __future__ import annotations

from celery import shared_task

from apps.core import services


@shared_task(name="apps.core.tasks.snapshot_refresh")
def snapshot_refresh() -> int | None:
    """Republish the runtime snapshot if the database changed since the last publish.

    Runs on the beat schedule (``CELERY_BEAT_SCHEDULE`` in settings). Returns the new version,
    or None when the published snapshot is current.
    """
    return services.snapshot_refresh()


@shared_task(name="apps.core.tasks.snapshot_outbox_drain")
def snapshot_outbox_drain() -> int | None:
    """Retry the snapshot publishes that failed (every ``SNAPSHOT_OUTBOX_RETRY_S`` on beat).

    Returns the version published, or None when nothing waited or Redis is still down.
    """
    return services.snapshot_outbox_drain().version
