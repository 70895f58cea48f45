"""``manage.py sign_artifact MODEL LABEL --key PRIVATE.pem``: sign a version's manifest digest.

The key's public half must already be trusted by the registry (``make_signing_key``, the admin
or ``POST /api/v1/ops/trusted-keys/``). What is signed: :mod:`runtime.signing`. A version may
be signed before or after it is published; signing again replaces the signature (audited).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.models.management.replica import registry_messages
from apps.models.models import ModelVersion
from apps.models.services.signing import model_version_sign_with
from runtime.signing import SignatureError, load_private_key


class Command(BaseCommand):
    help = (
        "Sign a model version's artifact digest with an Ed25519 private key (PEM) whose public "
        "key the registry trusts; workers verify the signature before loading the artifact."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("model", help="Registry model name, e.g. demo-llama.")
        parser.add_argument("label", help="Version label, e.g. v1.")
        parser.add_argument(
            "--key", type=Path, required=True, help="Unencrypted PEM Ed25519 private key."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        version = (
            ModelVersion.objects.select_related("model")
            .filter(model__name=options["model"], label=options["label"])
            .first()
        )
        if version is None:
            raise CommandError(f"no version {options['label']!r} of model {options['model']!r}")
        try:
            private_key = load_private_key(options["key"])
        except SignatureError as exc:
            raise CommandError(str(exc)) from exc
        try:
            version = model_version_sign_with(actor=None, version=version, private_key=private_key)
        except ValidationError as exc:
            raise CommandError(f"cannot sign {version}: {registry_messages(exc)}") from exc
        self.stdout.write(
            f"signed {version} (digest {version.digest}) with key {version.signing_key}"
        )
