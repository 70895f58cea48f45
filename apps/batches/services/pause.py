"""Credits: a batch whose tenant runs out pauses with the reason, and resumes on a grant.

When the router answers a line 402 (``insufficient_credits``, ``budget_exceeded``), the line
goes back to ``pending`` without spending one of its tries, and the batch is paused: no line
of it is claimed, its ``errors`` say why. Each tick resumes a paused batch once the tenant's
ledger balance is above what it was at the pause (a grant), or after :data:`PROBE_AFTER_S`
(a budget period may have rolled over): its next line probes the router again.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.batches.models import Batch
from apps.billing.selectors import credit_balance

PROBE_AFTER_S = 300.0


def _errors(code: str, message: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"code": code, "message": message, "line": None}]}


def batch_pause(*, batch_id: int, code: str, message: str) -> None:
    """Pause a running batch (once: a paused batch keeps its first reason)."""
    with transaction.atomic():
        batch = (
            Batch.objects.select_for_update()
            .select_related("tenant")
            .filter(pk=batch_id, status=Batch.Status.IN_PROGRESS, paused_at__isnull=True)
            .first()
        )
        if batch is None:
            return
        batch.paused_reason = f"{code}: {message}"[:300]
        batch.paused_at = timezone.now()
        batch.paused_balance = credit_balance(batch.tenant)
        batch.errors = _errors(code, message)
        batch.save(update_fields=["paused_reason", "paused_at", "paused_balance", "errors"])


def batches_resume_due() -> int:
    """Resume the paused batches whose tenant got credits, or that waited long enough."""
    resumed = 0
    probe_before = timezone.now() - timedelta(seconds=PROBE_AFTER_S)
    for batch in Batch.objects.filter(paused_at__isnull=False).select_related("tenant"):
        granted = credit_balance(batch.tenant) > (batch.paused_balance or 0)
        if granted or (batch.paused_at is not None and batch.paused_at <= probe_before):
            resumed += Batch.objects.filter(pk=batch.pk, paused_at=batch.paused_at).update(
                paused_reason="", paused_at=None, paused_balance=None, errors=None
            )
    return resumed
