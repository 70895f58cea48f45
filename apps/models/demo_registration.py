"""Registering the generated demo model as a ``ModelVersion`` (idempotent).

Composes the registry services; it writes nothing itself, so auditing and snapshot publishing
happen in :mod:`apps.models.services`.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from apps.models.demo import DemoArtifact
from apps.models.demo_adapter import AdapterArtifact
from apps.models.models import Model, ModelVersion
from apps.models.selectors import model_get_by_name
from apps.models.services import model_create, model_version_create, model_version_publish

DEMO_MODEL_NAME = "demo-llama"
DEMO_LABEL = "v1"
DEMO_ADAPTER_PREFIX = "demo-llama-lora-"  # + the seed: the demo adapters' model names
DEMO_MEMORY_GB = 0.5
# What an adapter version's manifest takes from its base's (it runs on the base's weights).
_INHERITED = ("tokenizer", "max_context", "default_sampling")
DEMO_DESCRIPTION = (
    "Tiny Llama-architecture chat model generated locally from a seed (random weights, "
    "byte-level BPE tokenizer); for demos and tests."
)


@dataclass(frozen=True, kw_only=True)
class DemoRegistration:
    version: ModelVersion
    model_created: bool
    version_created: bool
    published_now: bool


def demo_model_register(
    *,
    actor: AbstractBaseUser | None,
    artifact: DemoArtifact,
    model_name: str,
    label: str,
    publish: bool = True,
) -> DemoRegistration:
    """Register ``artifact`` as ``model_name:label`` and publish it unless ``publish`` is False.

    Running it again with the same artifact changes nothing. A label already registered for a
    different artifact (another digest or location) is refused: versions are immutable.
    """
    with transaction.atomic():
        model = model_get_by_name(model_name)
        model_created = model is None
        if model is None:
            model = model_create(
                actor=actor, name=model_name, task=Model.Task.CHAT, description=DEMO_DESCRIPTION
            )
        elif model.task not in (Model.Task.CHAT, Model.Task.COMPLETION):
            raise ValidationError(
                {"model": f"Model {model_name!r} is a {model.task} model, not a chat model."}
            )

        version = model.versions.filter(label=label).first()
        version_created = version is None
        if version is None:
            version = model_version_create(
                actor=actor,
                model=model,
                label=label,
                artifact_uri=artifact.uri,
                digest=artifact.digest,
                manifest=artifact.registry_manifest(),
                runtime=ModelVersion.Runtime.VLLM,
                memory_gb=DEMO_MEMORY_GB,
            )
        elif version.digest != artifact.digest:
            raise ValidationError(
                {
                    "label": f"{version} is already registered with digest {version.digest}, "
                    f"not {artifact.digest}; choose another label."
                }
            )
        elif version.artifact_uri != artifact.uri:
            raise ValidationError(
                {
                    "label": f"{version} is already registered at {version.artifact_uri}, "
                    f"not {artifact.uri}; generate it there or choose another label."
                }
            )

        published_now = publish and not version.is_published
        if published_now:
            version = model_version_publish(actor=actor, version=version)
    return DemoRegistration(
        version=version,
        model_created=model_created,
        version_created=version_created,
        published_now=published_now,
    )


def demo_adapter_register(
    *,
    actor: AbstractBaseUser | None,
    artifact: AdapterArtifact,
    base: ModelVersion,
    model_name: str,
    label: str,
) -> DemoRegistration:
    """Register ``artifact`` as the LoRA adapter ``model_name:label`` on ``base`` and publish it.

    Idempotent like :func:`demo_model_register`; the adapter inherits the base's tokenizer,
    context and default sampling in its manifest (the engine serves it on the base's weights).
    """
    with transaction.atomic():
        model = model_get_by_name(model_name)
        model_created = model is None
        if model is None:
            model = model_create(
                actor=actor, name=model_name, task=base.model.task,
                description=f"Demo LoRA adapter (seed {artifact.spec.seed}) on {base}.",
            )  # fmt: skip
        version = model.versions.filter(label=label).first()
        version_created = version is None
        if version is None:
            manifest = {
                **{k: base.manifest[k] for k in _INHERITED if k in base.manifest},
                **artifact.registry_manifest(),
            }
            version = model_version_create(
                actor=actor, model=model, label=label, artifact_uri=artifact.uri,
                digest=artifact.digest, manifest=manifest, runtime=base.runtime,
                memory_gb=0.0, base_version=base,
            )  # fmt: skip
        elif version.digest != artifact.digest or version.base_version_id != base.pk:
            raise ValidationError(
                {"label": f"{version} is already registered for another artifact or base; "
                 "choose another label."}
            )  # fmt: skip
        published_now = not version.is_published
        if published_now:
            version = model_version_publish(actor=actor, version=version)
    return DemoRegistration(
        version=version,
        model_created=model_created,
        version_created=version_created,
        published_now=published_now,
    )
