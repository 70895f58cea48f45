"""``manage.py make_demo_model``: generate the tiny demo Llama locally and register it.

Generation is deterministic (same seed, same bytes, same digest) and skipped when the output
folder already holds an intact model for that seed; registration is idempotent. The version is
signed with the demo key (apps.models.demo_signing) unless it is signed already.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from apps.models.demo import ensure_demo_model
from apps.models.demo_registration import DEMO_LABEL, DEMO_MODEL_NAME, demo_model_register
from apps.models.demo_signing import demo_sign

__all__ = ["DEMO_LABEL", "DEMO_MODEL_NAME", "Command"]


def _messages(exc: ValidationError) -> str:
    if hasattr(exc, "error_dict"):
        return "; ".join(
            f"{field}: {' '.join(errors)}" for field, errors in exc.message_dict.items()
        )
    return " ".join(exc.messages)


class Command(BaseCommand):
    help = (
        "Generate the tiny Llama-architecture demo model (deterministic from --seed, no hub "
        "access) and register it as a ModelVersion."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument(
            "--seed",
            type=int,
            default=0,
            help="Generation seed (default 0). Another seed makes another version of the demo "
            "model (label v<seed+1>, its own folder), e.g. a rollout's candidate.",
        )
        parser.add_argument(
            "--out",
            type=Path,
            default=None,
            help="Output folder (default: <VAR_DIR>/models/<model name>, plus -seed<N> for a "
            "seed other than 0).",
        )
        parser.add_argument("--model-name", default=DEMO_MODEL_NAME, help="Registry model name.")
        parser.add_argument(
            "--label", default=None, help="Version label (default v1; v<seed+1> for --seed)."
        )
        parser.add_argument(
            "--publish",
            action=argparse.BooleanOptionalAction,
            default=True,
            help="Publish the version so it can be routed to (default: --publish).",
        )
        parser.add_argument(
            "--json", action="store_true", help="Print one JSON object instead of text."
        )

    def handle(self, *args: Any, **options: Any) -> None:
        seed = options["seed"]
        folder = options["model_name"] if seed == 0 else f"{options['model_name']}-seed{seed}"
        out = options["out"] or Path(settings.VAR_DIR) / "models" / folder
        out = Path(out).expanduser().absolute()
        label = options["label"] or (DEMO_LABEL if seed == 0 else f"v{seed + 1}")
        try:
            artifact, generated = ensure_demo_model(out, seed=seed)
        except (FileExistsError, ValueError, OSError) as exc:
            raise CommandError(f"could not generate the demo model: {exc}") from exc
        try:
            registration = demo_model_register(
                actor=None,
                artifact=artifact,
                model_name=options["model_name"],
                label=label,
                publish=options["publish"],
            )
        except ValidationError as exc:
            raise CommandError(f"could not register the demo model: {_messages(exc)}") from exc

        version = registration.version
        signed_now = demo_sign(version=version, var_dir=Path(settings.VAR_DIR))
        if options["json"]:
            summary = {
                "path": str(artifact.path),
                "artifact_uri": artifact.uri,
                "digest": artifact.digest,
                "generated": generated,
                "model": version.model.name,
                "label": version.label,
                "version_id": version.pk,
                "version_created": registration.version_created,
                "published": version.is_published,
                "signed_now": signed_now,
            }
            self.stdout.write(json.dumps(summary, sort_keys=True))
            return
        state = "generated" if generated else "already up to date"
        self.stdout.write(f"demo model {state} in {artifact.path} (digest {artifact.digest})")
        if registration.version_created:
            self.stdout.write(f"registered {version}")
        else:
            self.stdout.write(f"{version} already registered")
        if registration.published_now:
            self.stdout.write(f"published {version}")
        elif version.is_published:
            self.stdout.write(f"{version} is published")
        else:
            self.stdout.write(f"{version} is a draft (not published)")
        if signed_now:
            self.stdout.write(f"signed {version} with the demo key {version.signing_key}")
