"""Credits: a batch whose tenant runs out pauses with the reason, and resumes on a grant.

When the router answers a line 402 (``insufficient_credits``, ``budget_exceeded``), the line
goes back to ``pending`` without spending one of its tries, and the batch is paused: no line
of it is claimed, its ``errors`` say why. Each tick resumes a paused batch once the tenant's
ledger balance is above what it was at the pause (a grant), or after :data:`PROBE_AFTER_S`
(a budget period may have rolled over): its next line probes the router again.

A lost balance is not a lack of credits: after a Redis restart that kept nothing, the routers
refuse every request 402 until the balances are seeded again from the ledger (the beat's
``credit_reconcile``, every 30 s), and the ledger balance the pause waits on never moved. So an
``insufficient_credits`` refusal for a tenant whose ledger balance is positive first
reconciles the balances at once (:func:`balance_restored`); when that repaired the tenant's
balance upwards, the line just runs again and the batch does not pause.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

import redis
from django.db import transaction
from django.utils import timezone

from apps.batches.models import Batch
from apps.billing import ledger
from apps.billing.selectors import credit_balance
from apps.tenants.models import Tenant

logger = logging.getLogger(__name__)

PROBE_AFTER_S = 300.0
CREDITS_REFUSED = "insufficient_credits"


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


def balance_restored(*, tenant: Tenant, code: str) -> bool:
    """A line refused 402 ``code``: when it is ``insufficient_credits`` and the ledger says the
    tenant has credits, reconcile the routers' balances with the ledger now
    (:func:`apps.billing.ledger.credit_reconcile`, audited); whether that raised this tenant's
    balance (it was lost or under the ledger's count), so the refusal was not the tenant's.
    False (pause as usual) when the ledger agrees with the router, or Redis cannot be reached."""
    if code != CREDITS_REFUSED or credit_balance(tenant) <= 0:
        return False
    try:
        repairs = ledger.credit_reconcile()
    except (redis.exceptions.RedisError, TimeoutError) as exc:
        logger.warning("batch 402 for %s: the balance reconciliation failed: %s", tenant.slug, exc)
        return False
    return any(
        r.tenant == tenant.slug and (r.redis_uc is None or r.expected_uc > r.redis_uc)
        for r in repairs
    )
