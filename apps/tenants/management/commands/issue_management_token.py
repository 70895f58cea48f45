"""``manage.py issue_management_token <tenant> --role owner``: a tenant's first REST token.

Prints the full token once (only its digest is stored). Owners make further tokens through
the REST API (``POST /api/v1/tenants/<slug>/tokens/``).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.tenants.models import Membership
from apps.tenants.selectors import tenant_get
from apps.tenants.services.management_tokens import management_token_create


class Command(BaseCommand):
    help = "Issue a management token (REST API credential) for a tenant; prints it once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("tenant", help="tenant slug")
        parser.add_argument("--name", default="bootstrap")
        parser.add_argument("--role", default="owner", choices=Membership.Role.values)

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = tenant_get(options["tenant"])
        if tenant is None:
            raise CommandError(f"no tenant with slug {options['tenant']!r}")
        try:
            _token, full = management_token_create(
                actor=None, tenant=tenant, name=options["name"], role=options["role"]
            )
        except ValidationError as exc:
            raise CommandError(f"cannot issue the token: {exc}") from exc
        self.stdout.write(full)
