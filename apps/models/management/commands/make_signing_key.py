"""``manage.py make_signing_key NAME --out PRIVATE.pem``: a new Ed25519 signing key.

Writes the private key to ``--out`` (PEM, mode 0600, never overwriting a file) and registers its
public key as the trusted key ``NAME`` (``--no-register``: only print it, e.g. to add it to
another registry). Keep the private key off the machines that serve models.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.models.management.replica import registry_messages
from apps.models.services.signing import trusted_key_create, trusted_key_name_error
from runtime.signing import SignatureError, create_private_key_file, public_key_text


class Command(BaseCommand):
    help = (
        "Generate an Ed25519 signing key: the private key into --out (0600) and its public key "
        "registered as a trusted key named NAME."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="Trusted key name (lowercase letters, digits, '-').")
        parser.add_argument("--out", type=Path, required=True, help="New private key file.")
        parser.add_argument(
            "--no-register",
            action="store_true",
            help="Do not add the public key to this registry; only print it.",
        )

    def handle(self, *args: Any, **options: Any) -> None:
        name = options["name"]
        register = not options["no_register"]
        name_error = trusted_key_name_error(name) if register else None
        if name_error is not None:  # before writing a key file
            raise CommandError(f"name: {name_error}")
        try:
            private_key = create_private_key_file(options["out"])
        except SignatureError as exc:
            raise CommandError(str(exc)) from exc
        public_key = public_key_text(private_key)
        self.stdout.write(f"private key written to {options['out']} (keep it secret)")
        if register:
            try:
                trusted_key_create(actor=None, name=name, public_key=public_key)
            except ValidationError as exc:
                raise CommandError(registry_messages(exc)) from exc
            self.stdout.write(f"trusted key {name} registered: {public_key}")
        else:
            self.stdout.write(f"public key: {public_key}")
