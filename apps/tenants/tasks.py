"""Celery tasks of the tenants app: fetch, call a service, nothing else."""

from __future__ import annotations

from celery import shared_task

from apps.tenants.services import api_key_usage_sync


@shared_task(name="apps.tenants.tasks.api_keys_sync_last_used", ignore_result=True)
def api_keys_sync_last_used() -> int:
    """Copy the routers' API-key last-use times into PostgreSQL (on the beat schedule).

    Returns how many keys were touched.
    """
    return api_key_usage_sync()
