"""``manage.py cache_purge --tenant SLUG | --model-version MODEL:LABEL``: drop cached results."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.models.models import ModelVersion
from apps.models.services.cache import cache_purge_run
from apps.tenants.models import Tenant


class Command(BaseCommand):
    help = "Purge the result cache of a tenant and/or a model version (audited)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--tenant", help="tenant slug")
        parser.add_argument("--model-version", dest="model_version", help="MODEL:LABEL")

    def handle(self, *args: Any, **options: Any) -> None:
        tenant = version = None
        if options["tenant"]:
            tenant = Tenant.objects.filter(slug=options["tenant"]).first()
            if tenant is None:
                raise CommandError(f"no tenant {options['tenant']!r}")
        if options["model_version"]:
            model, _, label = options["model_version"].partition(":")
            version = ModelVersion.objects.filter(model__name=model, label=label).first()
            if version is None:
                raise CommandError(f"no model version {options['model_version']!r}")
        if tenant is None and version is None:
            raise CommandError("name --tenant and/or --model-version")
        removed = cache_purge_run(actor=None, tenant=tenant, version=version)
        self.stdout.write(f"purged {removed} cached results")
