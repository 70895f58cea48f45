"""Celery tasks of billing: fetch, call a service, nothing else.

The webhook task ``apps.billing.tasks.budget_alert_deliver`` is defined next to the alerts
(:func:`apps.billing.alerts.budget_alert_send`) and registered by this module's import.
"""

from __future__ import annotations

import os
import socket

from celery import shared_task

from apps.billing import drift, ledger
from apps.billing.alerts import budget_alert_send


@shared_task(name="apps.billing.tasks.usage_consume", ignore_result=True)
def usage_consume(batches: int = 20, claim_idle_ms: int = 30_000) -> int:
    """Move usage events from the routers' stream into the ledger (beat: every second).

    Up to ``batches`` batches per run, each written in one transaction and acked after its
    commit; returns how many entries were handled.
    """
    consumer = f"ledger-{socket.gethostname()}-{os.getpid()}"
    handled = 0
    for _ in range(batches):
        done = ledger.usage_consume(consumer=consumer, block_ms=None, claim_idle_ms=claim_idle_ms)
        handled += done
        if not done:
            break
    return handled


@shared_task(name="apps.billing.tasks.credit_reconcile", ignore_result=True)
def credit_reconcile() -> int:
    """Compare the Redis balances with the ledger and repair drift (audited); returns how many
    tenants were repaired (beat: every 30 s; also seeds Redis after a restart). What it found
    is kept for the control plane's /metrics (apps.billing.drift)."""
    client = ledger.redis_client()
    try:
        repairs = ledger.credit_reconcile(client=client)
        drift.reconcile_record(client=client, namespace=ledger.namespace(), repairs=repairs)
    finally:
        client.close()
    return len(repairs)


__all__ = ["budget_alert_send", "credit_reconcile", "usage_consume"]
