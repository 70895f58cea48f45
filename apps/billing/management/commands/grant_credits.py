"""``manage.py grant_credits <tenant> <amount> --reason ...``: add (or correct) credits."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser
from redis.exceptions import RedisError

from apps.billing.ledger import credit_live
from apps.billing.selectors import credit_balance
from apps.billing.services import credit_grant
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = "Grant credits to a tenant (negative to correct a mistake); audited, live in a second."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("amount", help="credits, e.g. 100 or 2.5 (negative to correct)")
        parser.add_argument("--reason", required=True, help="why (goes to the audit log)")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = Tenant.objects.filter(slug=options["tenant"]).first()
        if tenant is None:
            raise CommandError(f"no tenant {options['tenant']!r}")
        try:
            credit_grant(
                actor=None, tenant=tenant, amount=options["amount"], reason=options["reason"]
            )
        except ValidationError as exc:
            raise CommandError(
                "; ".join(f"{k}: {' '.join(v)}" for k, v in exc.message_dict.items())
            ) from None
        self.stdout.write(f"{tenant.slug}: ledger balance {credit_balance(tenant)} credits")
        try:
            live = credit_live(tenant)
        except (RedisError, OSError) as exc:  # Redis away: the ledger answer stands
            self.stdout.write(f"routers: Redis not reachable ({exc})")
            return
        self.stdout.write(f"routers: {live['available']} available, {live['escrow']} in escrow")
