"""``manage.py seed_demo``: create the demo data where it is missing (see apps.core.demo_seed).

Prints the operator's password and the API keys only on the run that created them. With
``--json`` the progress goes to stderr and stdout carries one JSON line (``up`` reads it).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.core.demo_seed import demo_seed


class Command(BaseCommand):
    help = "Seed the demo tenants, classes, operator, pool, model and prices (idempotent)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--json", action="store_true", help="print the result as one JSON line on stdout"
        )

    def handle(self, *args: Any, **options: Any) -> None:
        progress = self.stderr if options["json"] else self.stdout
        try:
            result = demo_seed(stdout=progress)
        except ValidationError as exc:
            raise CommandError(f"seeding the demo failed: {exc}") from exc
        if options["json"]:
            self.stdout.write(result.as_json())
            return
        if result.operator_password:
            self.stdout.write(
                f"operator login: {result.operator_username} / {result.operator_password} "
                "(shown once)"
            )
        for slug, key in result.api_keys.items():
            self.stdout.write(f"API key for {slug}: {key} (shown once)")
