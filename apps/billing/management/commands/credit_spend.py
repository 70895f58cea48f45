"""``manage.py credit_spend <tenant>``: a tenant's balance, spend and budgets."""

from __future__ import annotations

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from apps.billing.ledger import credit_live
from apps.billing.selectors import (
    budgets_for,
    credit_balance,
    period_starts,
    usage_totals,
)
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = (
        "Show a tenant's credit balance (ledger and routers), spend today and this month, budgets."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("--json", action="store_true", help="one JSON object")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"no tenant {options['tenant']!r}")
        day, month = period_starts()
        report: dict[str, Any] = {
            "tenant": tenant.slug,
            "ledger_balance": str(credit_balance(tenant)),
            "today": {k: str(v) for k, v in usage_totals(tenant, day).items()},
            "this_month": {k: str(v) for k, v in usage_totals(tenant, month).items()},
            "budgets": [
                {
                    "period": b.period,
                    "hard_cap": str(b.hard_cap),
                    "soft_alert_pct": b.soft_alert_pct,
                }
                for b in budgets_for(tenant)
            ],
        }
        try:
            report["routers"] = {k: str(v) for k, v in credit_live(tenant).items()}
        except (RedisError, OSError) as exc:  # Redis away: report the ledger only
            report["routers"] = {"error": str(exc)}
        if options["json"]:
            self.stdout.write(json.dumps(report))
            return
        self.stdout.write(f"{tenant.slug}: ledger balance {report['ledger_balance']} credits")
        routers = report["routers"]
        if "error" in routers:
            self.stdout.write(f"  routers: Redis not reachable ({routers['error']})")
        else:
            self.stdout.write(
                f"  routers: {routers['available']} available, {routers['escrow']} in escrow"
            )
        for label in ("today", "this_month"):
            t = report[label]
            self.stdout.write(
                f"  {label.replace('_', ' ')}: {t['requests']} requests, {t['tokens_in']} in / "
                f"{t['tokens_out']} out tokens, {t['credits']} credits"
            )
        for budget in report["budgets"]:
            self.stdout.write(
                f"  budget per {budget['period']}: cap {budget['hard_cap']}, "
                f"alert at {budget['soft_alert_pct']} %"
            )
