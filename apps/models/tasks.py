"""Celery tasks of the model registry: fetch, call a service, nothing else."""

from __future__ import annotations

from celery import shared_task

from apps.models import services
from apps.models.services.reaper import HEARTBEAT_TTL_S

__all__ = ["HEARTBEAT_TTL_S", "endpoints_reap_stale"]


@shared_task(name="apps.models.tasks.endpoints_reap_stale", ignore_result=True)
def endpoints_reap_stale() -> list[int]:
    """Mark gone the live endpoints whose worker stopped heartbeating (on the beat schedule,
    ``CELERY_BEAT_SCHEDULE``); see :func:`apps.models.services.endpoints_reap_stale`."""
    return services.endpoints_reap_stale()
