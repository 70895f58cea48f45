"""Soft budget alerts: fire each once per budget and period, POST it to the budget's webhook.

The ledger checks the budgets of the tenants a usage batch charged (:func:`budget_alerts_check`)
right after writing it; the webhook goes out from a task (:func:`budget_alert_send`) after
the commit. This module sits below both the ledger and the services, so neither needs a
deferred import of the other.
"""

from __future__ import annotations

import functools
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Iterable

from celery import shared_task
from django.db import transaction

from apps.billing.models import Budget, BudgetAlert
from apps.billing.selectors import period_starts, usage_totals
from apps.common.audit import audit_record

logger = logging.getLogger(__name__)


def budget_alerts_check(*, tenant_ids: Iterable[int]) -> list[BudgetAlert]:
    """Fire each soft alert whose threshold this period's spend reached (once per budget and
    period start); a budget with a webhook URL gets it POSTed after the commit."""
    fired: list[BudgetAlert] = []
    starts = dict(zip(("day", "month"), period_starts(), strict=True))
    for budget in Budget.objects.filter(tenant_id__in=list(tenant_ids)).select_related("tenant"):
        start = starts[budget.period]
        spent = usage_totals(budget.tenant, start)["credits"]
        threshold = budget.hard_cap * budget.soft_alert_pct / 100
        if spent < threshold:
            continue
        with transaction.atomic():
            alert, created = BudgetAlert.objects.get_or_create(
                budget=budget,
                period_start=start.date(),
                defaults={"spent": spent, "threshold": threshold},
            )
            if not created:
                continue
            audit_record(
                actor=None,
                action="budget.alert",
                target=budget,
                after={"spent": spent, "threshold": threshold, "period_start": start.date()},
            )
            if budget.webhook_url:
                alert_id = alert.pk
                transaction.on_commit(functools.partial(_deliver_later, alert_id))
        fired.append(alert)
    return fired


def _deliver_later(alert_id: int) -> None:
    try:
        budget_alert_send.delay(alert_id=alert_id)
    except Exception as exc:  # the broker is away: the alert record stays
        logger.warning("budget alert %s: webhook not queued (%r)", alert_id, exc)


def budget_alert_deliver(*, alert: BudgetAlert, timeout_s: float = 5.0) -> str:
    """POST the alert as JSON to its budget's webhook URL; records and returns the status."""
    budget = alert.budget
    body = json.dumps(
        {
            "type": "budget.soft_alert",
            "tenant": budget.tenant.slug,
            "period": budget.period,
            "period_start": alert.period_start.isoformat(),
            "spent": str(alert.spent),
            "threshold": str(alert.threshold),
            "hard_cap": str(budget.hard_cap),
        }
    ).encode()
    request = urllib.request.Request(  # noqa: S310 - the URL is validated as http(s)
        budget.webhook_url, data=body, headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:  # noqa: S310
            status = f"http {answer.status}"
    except urllib.error.HTTPError as exc:
        status = f"http {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        status = f"failed: {exc}"[:64]
    alert.webhook_status = status
    alert.save(update_fields=["webhook_status"])
    return status


@shared_task(name="apps.billing.tasks.budget_alert_deliver", ignore_result=True)
def budget_alert_send(*, alert_id: int) -> str:
    """POST one soft budget alert to its webhook."""
    alert = BudgetAlert.objects.select_related("budget__tenant").get(pk=alert_id)
    return budget_alert_deliver(alert=alert)
