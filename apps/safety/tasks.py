"""Celery tasks of safety: fetch, call a service, nothing else."""

from __future__ import annotations

import os
import socket

from celery import shared_task

from apps.safety import consume


@shared_task(name="apps.safety.tasks.interventions_consume", ignore_result=True)
def interventions_consume(batches: int = 20, claim_idle_ms: int = 30_000) -> int:
    """Move the routers' safety interventions into the audit log (beat: every second)."""
    consumer = f"audit-{socket.gethostname()}-{os.getpid()}"
    client = consume.redis_client()
    handled = 0
    try:
        for _ in range(batches):
            done = consume.interventions_consume(
                client=client, consumer=consumer, claim_idle_ms=claim_idle_ms
            )
            handled += done
            if not done:
                break
    finally:
        client.close()
    return handled
