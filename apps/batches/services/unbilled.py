"""Bill the batch lines whose usage event never reached the ledger (issue #32, item 4).

A line is billed by the router's usage event ``batch-line-<line id>`` (the same on every try,
the ledger's unique ``UsageRecord.event_id``). That event travels through Redis: the router's
settle script appends it to the usage stream, the usage consumer writes it to the ledger. A
Redis that loses the stream's unread tail (a restart without persistence, a failover to a
replica behind), or a router killed with the event still in its spool, leaves a ``done`` line
charged zero times.

:func:`lines_bill_missing` repairs that from PostgreSQL alone: a ``done`` line with a
``usage_event_id`` and the usage recorded with its answer (``BatchLine.usage``: the version
that served it, its class, its tokens) that

- finished more than ``SWITCHYARD_BATCH_BILL_GRACE_S`` ago (the router's spool has flushed
  by then, and the consumer, on beat every second, has moved past the line's done time),
- has no ledger record under its event id, and
- is not in the usage stream now (its event is not waiting for the consumer),

is charged what the router would have charged (the version's price on the hardware tier of
its pool at the batch rate, less the price's batch discount; the cache-hit discount for a
cached answer) by the ledger's own writer
(:func:`apps.billing.ledger.usage_write`) under the line's event id. The ledger stays the
judge: a stream record arriving after the repair, or a repair racing the consumer, finds the
event id recorded and is skipped, so the line is charged once either way. The Redis balance
follows by reconciliation (:func:`apps.billing.ledger.credit_reconcile`).

Why a periodic task (beat entry ``bill-batch-lines``, every
``SWITCHYARD_BATCH_BILL_EVERY_S``) and not the batch's finalisation: the finalisation runs
as soon as the last line is answered, before its event could have reached the ledger, so it
cannot tell a late event from a lost one; a batch ends once, a lost event is only known
after the grace. The task is idempotent (the ledger's unique event id), bounded
(:data:`BATCH_ROWS` lines per run) and looks back :data:`HORIZON` (well inside the ledger's
32-day minimum retention, so a record removed by retention never looks missing).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db.models import Exists, OuterRef
from django.utils import timezone

from apps.batches.models import BatchLine
from apps.billing import ledger
from apps.billing.alerts import budget_alerts_check
from apps.billing.models import Price, UsageRecord
from apps.models.models import ModelVersion, Pool
from runtime.metering.events import UsageEvent
from runtime.metering.pricing import Rate
from runtime.snapshot import PriceSnap

logger = logging.getLogger(__name__)

BATCH_ROWS = 500  # lines one run looks at, at most
HORIZON = timedelta(days=7)


def lines_bill_missing(*, client: Any = None, limit: int = BATCH_ROWS) -> list[str]:
    """Charge the done lines the ledger has no record of (see the module); the event ids
    charged. Does nothing while Redis cannot say what the stream still holds."""
    now = timezone.now()
    grace = timedelta(seconds=settings.BATCH_BILL_GRACE_S)
    recorded = UsageRecord.objects.filter(event_id=OuterRef("usage_event_id"))
    candidates = list(
        BatchLine.objects.filter(state=BatchLine.State.DONE, usage__isnull=False,
                                 finished_at__lte=now - grace, finished_at__gte=now - HORIZON)
        .exclude(usage_event_id="")
        .filter(~Exists(recorded))
        .select_related("batch", "batch__tenant")
        .order_by("finished_at")[:limit]
    )  # fmt: skip
    if not candidates:
        return []
    client = client or ledger.redis_client()
    waiting = ledger.usage_stream_ids(client)  # raises while Redis is away: nothing charged
    events = [_event(line) for line in candidates if line.usage_event_id not in waiting]
    tenants = ledger.usage_write(events=[(event, event.cost_uc) for event in events])
    if tenants:
        budget_alerts_check(tenant_ids=tenants)
    ids = [event.id for event in events]
    if ids:
        logger.warning("batch lines billed from their answers (usage events lost): %s", ids)
    return ids


def _event(line: BatchLine) -> UsageEvent:
    usage: dict[str, Any] = line.usage or {}
    version = _version(str(usage.get("model", "")), str(usage.get("version", "")))
    tier, rate = _rate(version)
    tokens_in, tokens_out = int(usage.get("tokens_in", 0)), int(usage.get("tokens_out", 0))
    cached = bool(usage.get("cached", False))
    finished = line.finished_at or timezone.now()
    return UsageEvent(
        id=line.usage_event_id, tenant=line.batch.tenant.slug,
        api_key=line.batch.exec_key_prefix, version=version.pk if version else 0,
        endpoint=None, tier=tier, request_class=str(usage.get("request_class", "default")),
        tokens_in=tokens_in, tokens_out=tokens_out,
        cost_uc=rate.cost(tokens_in, tokens_out, cached=cached) if rate else 0,
        cached=cached, outcome="ok", occurred_at=finished.timestamp(),
        request_id=line.request_id,
    )  # fmt: skip


def _version(model: str, label: str) -> ModelVersion | None:
    found = ModelVersion.objects.filter(model__name=model, label=label).first()
    if found is None:
        logger.error("batch billing: no version %r of model %r (charged nothing)", label, model)
    return found


def _rate(version: ModelVersion | None) -> tuple[str, Rate | None]:
    """The hardware tier of the version's pool and its batch rate there, as the router picks
    them (no price on that tier: free)."""
    if version is None:
        return "", None
    tiers = sorted(
        set(Pool.objects.filter(endpoints__version=version).values_list("hardware_tier", flat=True))
    )
    prices = {p.hardware_tier: p for p in Price.objects.filter(version=version)}
    tier = next((t for t in tiers if t in prices), tiers[0] if tiers else "")
    if not tiers and len(prices) == 1:  # its replicas are gone: the one price it has
        tier = next(iter(prices))
    price = prices.get(tier)
    if price is None:
        return tier, None
    # The router's arithmetic: the snapshot's price (floats), at the batch rate (a line is sent
    # with its batch's key: the price's batch discount off both token prices).
    snap = PriceSnap(version=price.version_id, hardware_tier=tier,
                     input_per_1k=float(price.input_per_1k),
                     output_per_1k=float(price.output_per_1k),
                     cache_hit_discount=float(price.cache_hit_discount),
                     batch_discount=float(price.batch_discount))  # fmt: skip
    return tier, Rate.of(snap).for_batch()
