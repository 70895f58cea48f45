"""``manage.py make_demo_adapter --seed N``: a LoRA adapter on the demo model, made and registered.

The adapter is generated locally with ``peft`` from the seed (apps.models.demo_adapter; no hub
access), registered as version ``v1`` of the model ``demo-llama-lora-<N>`` whose base is the
demo model's ``v1`` (``make_demo_model`` first), published, and signed with the demo key.
Idempotent: a second run verifies the files and changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.models.demo_adapter import AdapterSpec, ensure_demo_adapter
from apps.models.demo_registration import (
    DEMO_ADAPTER_PREFIX,
    DEMO_LABEL,
    DEMO_MODEL_NAME,
    demo_adapter_register,
)
from apps.models.demo_signing import demo_sign
from apps.models.management.commands.make_demo_model import _messages
from apps.models.management.replica import artifact_dir
from apps.models.models import ModelVersion


class Command(BaseCommand):
    help = (
        "Generate a LoRA adapter on the demo model with peft (deterministic from --seed, no hub "
        "access) and register it as the model demo-llama-lora-<seed>."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--seed", type=int, default=1, help="Generation seed (default 1).")
        parser.add_argument("--rank", type=int, default=8, help="LoRA rank (default 8).")
        parser.add_argument(
            "--out", type=Path, default=None,
            help="Output folder (default: <VAR_DIR>/adapters/<model name>).",
        )  # fmt: skip
        parser.add_argument("--json", action="store_true", help="Print one JSON object.")

    def handle(self, *args: Any, **options: Any) -> None:
        seed, rank = options["seed"], options["rank"]
        if seed < 0 or not 1 <= rank <= 64:
            raise CommandError("--seed must be >= 0 and --rank from 1 to 64")
        base = (
            ModelVersion.objects.select_related("model")
            .filter(model__name=DEMO_MODEL_NAME, label=DEMO_LABEL, published_at__isnull=False)
            .first()
        )
        if base is None:
            raise CommandError(
                f"{DEMO_MODEL_NAME}:{DEMO_LABEL} is not published; run make_demo_model"
            )
        name = f"{DEMO_ADAPTER_PREFIX}{seed}"
        out = options["out"] or Path(settings.VAR_DIR) / "adapters" / name
        spec = AdapterSpec(seed=seed, rank=rank, alpha=2 * rank, base_digest=base.digest)
        base_dir = artifact_dir(base)
        try:
            artifact, generated = ensure_demo_adapter(
                Path(out).expanduser().absolute(), base_dir=base_dir, spec=spec
            )
        except (FileExistsError, ValueError, OSError) as exc:
            raise CommandError(f"could not generate the demo adapter: {exc}") from exc
        try:
            registration = demo_adapter_register(
                actor=None, artifact=artifact, base=base, model_name=name, label=DEMO_LABEL
            )
        except ValidationError as exc:
            raise CommandError(f"could not register the demo adapter: {_messages(exc)}") from exc
        version = registration.version
        signed_now = demo_sign(version=version, var_dir=Path(settings.VAR_DIR))
        summary = {
            "path": str(artifact.path), "digest": artifact.digest, "generated": generated,
            "model": name, "label": version.label, "version_id": version.pk,
            "base": str(base), "version_created": registration.version_created,
            "signed_now": signed_now,
        }  # fmt: skip
        if options["json"]:
            self.stdout.write(json.dumps(summary, sort_keys=True))
            return
        state = "generated" if generated else "already up to date"
        self.stdout.write(f"demo adapter {state} in {artifact.path} (digest {artifact.digest})")
        self.stdout.write(f"{version} on {base}: " + (
            "registered and published" if registration.version_created else "already registered"
        ))  # fmt: skip
