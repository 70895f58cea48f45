"""Registry services for models and their versions (immutable once published)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction
from django.utils import timezone

from apps.common import validation as cv
from apps.common.audit import audit_record, audit_state
from apps.common.changes import audited_update
from apps.common.outbox import snapshot_publish_on_commit
from apps.common.validation import exists_other, refuse_unknown
from apps.models import validators as v
from apps.models.models import Model, ModelVersion
from apps.models.services import adapters, aliases
from runtime.artifacts import manifest_digest

VERSION_FIELDS = (
    "label",
    "artifact_uri",
    "digest",
    "manifest",
    "runtime",
    "memory_gb",
    "tensor_parallel_size",
    "capabilities",
    "base_version",
)
MODEL_FIELDS = ("name", "task", "description", "refused_fields")
# Degradation's fallback and an alias's members (apps.models.services.aliases).
MODEL_ALIAS_FIELDS = ("fallback", "members")
# The result-cache switches the snapshot carries per model (CachePolicySnap).
MODEL_CACHE_FIELDS = ("cache_enabled", "cache_shared", "cache_ttl_s")
MODEL_WRITABLE_FIELDS = (*MODEL_FIELDS, *MODEL_ALIAS_FIELDS, *MODEL_CACHE_FIELDS)


def model_cache_errors(values: Mapping[str, Any]) -> dict[str, str | None]:
    """The cache switches present in ``values``: two booleans and a TTL of at least 1 s."""
    errors: dict[str, str | None] = {}
    for field in ("cache_enabled", "cache_shared"):
        if field in values:
            errors[field] = cv.bool_error(values[field])
    if "cache_ttl_s" in values:
        errors["cache_ttl_s"] = cv.int_range_error(values["cache_ttl_s"], minimum=1)
    return errors


def _model_state(model: Model, fields: tuple[str, ...] = MODEL_WRITABLE_FIELDS) -> dict[str, Any]:
    """The model's ``fields`` for an audit record (the fallback by name)."""
    state = audit_state(model, [f for f in fields if f != "fallback"])
    if "fallback" in fields:
        state["fallback"] = model.fallback.name if model.fallback is not None else None
    return state


def _created_state(model: Model) -> dict[str, Any]:
    """A create's audit record: the model's fields, and the fallback and the cache switches
    set off default."""
    state = _model_state(model, MODEL_FIELDS)
    if model.fallback is not None:
        state["fallback"] = model.fallback.name
    if model.members:
        state["members"] = model.members
    defaults = Model()
    for field in MODEL_CACHE_FIELDS:
        if getattr(model, field) != getattr(defaults, field):
            state[field] = getattr(model, field)
    return state


# --- models ---------------------------------------------------------------------------------


def model_validate(
    *,
    name: str,
    task: str,
    refused_fields: object = (),
    exclude_pk: int | None = None,
    cache: Mapping[str, Any] | None = None,
    fallback: Model | None = None,
    members: object = (),
) -> None:
    """The model's rules; ``cache`` holds whichever cache switches are being written; the
    fallback's and an alias's members' are :mod:`apps.models.services.aliases`'."""
    name_error = v.model_name_error(name)
    if name_error is None and exists_other(Model.objects.filter(name=name), exclude_pk):
        name_error = f"A model named {name!r} already exists."
    if name_error is None and exclude_pk is not None:
        name_error = aliases.rename_error(Model.objects.get(pk=exclude_pk), name)
    members = list(members) if isinstance(members, tuple) else members
    cv.raise_if(
        {
            "name": name_error,
            "task": None
            if task in Model.Task.values
            else f"Task must be one of {Model.Task.values}.",
            "refused_fields": v.refused_fields_error(
                list(refused_fields) if isinstance(refused_fields, tuple) else refused_fields
            ),
            **model_cache_errors(cache or {}),
            "fallback": aliases.fallback_error(
                name=name, task=task, fallback=fallback, exclude_pk=exclude_pk
            ),
            "members": aliases.members_error(
                name=name, task=task, members=members, exclude_pk=exclude_pk
            ),
        }
    )


def model_create(
    *,
    actor: AbstractBaseUser | None,
    name: str,
    task: str,
    description: str = "",
    refused_fields: list[str] | None = None,
    fallback: Model | None = None,
    members: list[str] | None = None,
    **cache: Any,
) -> Model:
    """A new model (an alias when ``members`` names models); ``cache`` may set
    ``cache_enabled``, ``cache_shared``, ``cache_ttl_s``."""
    refuse_unknown(cache, MODEL_CACHE_FIELDS)
    refused = list(refused_fields or [])
    listed = list(members or [])
    model_validate(name=name, task=task, refused_fields=refused, cache=cache,
                   fallback=fallback, members=listed)  # fmt: skip
    with transaction.atomic():
        try:
            with transaction.atomic():
                model = Model.objects.create(
                    name=name, task=task, description=description, refused_fields=refused,
                    fallback=fallback, members=listed, **cache,
                )  # fmt: skip
        except IntegrityError as exc:
            raise ValidationError({"name": f"A model named {name!r} already exists."}) from exc
        audit_record(actor=actor, action="model.create", target=model, after=_created_state(model))
        snapshot_publish_on_commit()
    return model


def model_update(*, actor: AbstractBaseUser | None, model: Model, **changes: Any) -> Model:
    refuse_unknown(changes, MODEL_WRITABLE_FIELDS)
    merged = {**audit_state(model, MODEL_WRITABLE_FIELDS), **changes}
    model_validate(
        name=merged["name"],
        task=merged["task"],
        refused_fields=merged["refused_fields"],
        exclude_pk=model.pk,
        cache={field: merged[field] for field in MODEL_CACHE_FIELDS},
        fallback=merged["fallback"],
        members=merged["members"],
    )
    with transaction.atomic():
        before = _model_state(model)
        for field, value in changes.items():
            setattr(model, field, value)
        model.save()
        audit_record(
            actor=actor,
            action="model.update",
            target=model,
            before=before,
            after=_model_state(model),
        )
        snapshot_publish_on_commit()
    return model


# --- versions -------------------------------------------------------------------------------


def _version_state(version: ModelVersion) -> dict[str, Any]:
    """The version's fields for an audit record (an adapter's base by name)."""
    state = audit_state(version, VERSION_FIELDS)
    base = state["base_version"]
    state["base_version"] = str(base) if base is not None else None
    return state


def model_version_validate(
    *,
    model: Model,
    label: str,
    artifact_uri: str,
    digest: str,
    manifest: object,
    runtime: str,
    memory_gb: float,
    tensor_parallel_size: int,
    capabilities: object = (),
    base_version: ModelVersion | None = None,
    exclude_pk: int | None = None,
) -> None:
    """Rules for a draft version. The manifest may be partial; publishing needs all of it."""
    label_error = v.label_error(label)
    capabilities = list(capabilities) if isinstance(capabilities, tuple) else capabilities
    if label_error is None and exists_other(model.versions.filter(label=label), exclude_pk):
        label_error = f"Model {model.name!r} already has a version labelled {label!r}."
    uri_ok = (
        isinstance(artifact_uri, str)
        and artifact_uri.strip() == artifact_uri
        and 0 < len(artifact_uri) <= 500
    )
    manifest_errors = v.manifest_errors(manifest, complete=False)
    tp_ok = cv.is_int(tensor_parallel_size) and 1 <= tensor_parallel_size <= 1024
    cv.raise_if(
        {
            "label": label_error,
            "artifact_uri": None
            if uri_ok
            else "Artifact URI must be 1-500 characters without surrounding spaces.",
            "digest": None
            if v.is_sha256(digest)
            else "Digest must be a sha256: 64 lowercase hex digits.",
            "manifest": manifest_errors,
            "runtime": None
            if runtime in ModelVersion.Runtime.values
            else f"Runtime must be one of {ModelVersion.Runtime.values}.",
            "memory_gb": cv.float_error(memory_gb, minimum=0.0),
            "tensor_parallel_size": None
            if tp_ok
            else "Tensor parallel size must be an integer from 1 to 1024.",
            "capabilities": v.capabilities_error(capabilities),
            "model": aliases.alias_version_error(model),
            "base_version": adapters.base_version_error(
                model=model, base_version=base_version, runtime=runtime
            ),
        }
    )


def model_version_create(
    *,
    actor: AbstractBaseUser | None,
    model: Model,
    label: str,
    artifact_uri: str,
    digest: str,
    manifest: dict[str, Any],
    runtime: str,
    memory_gb: float = 1.0,
    tensor_parallel_size: int = 1,
    capabilities: list[str] | None = None,
    base_version: ModelVersion | None = None,
) -> ModelVersion:
    """A draft version; with ``base_version``, a LoRA adapter on it (services.adapters)."""
    fields: dict[str, Any] = {
        "capabilities": list(capabilities or []),
        "base_version": base_version,
        "label": label,
        "artifact_uri": artifact_uri,
        "digest": digest,
        "manifest": manifest,
        "runtime": runtime,
        "memory_gb": memory_gb,
        "tensor_parallel_size": tensor_parallel_size,
    }
    model_version_validate(model=model, **fields)
    with transaction.atomic():
        try:
            with transaction.atomic():
                version = ModelVersion.objects.create(model=model, **fields)
        except IntegrityError as exc:
            raise ValidationError(
                {"label": f"Model {model.name!r} already has a version labelled {label!r}."}
            ) from exc
        audit_record(
            actor=actor,
            action="model_version.create",
            target=version,
            after=_version_state(version),
        )
        snapshot_publish_on_commit()
    return version


def published_error(version: ModelVersion) -> ValidationError:
    return ValidationError(
        f"Version {version} is published and immutable (artifact, digest, manifest, runtime and "
        "resources can no longer change); create a new version instead."
    )


def model_version_update_validate(*, version: ModelVersion, **changes: Any) -> None:
    if version.is_published:
        raise published_error(version)
    refuse_unknown(changes, VERSION_FIELDS)
    merged = {**{field: getattr(version, field) for field in VERSION_FIELDS}, **changes}
    model_version_validate(model=version.model, exclude_pk=version.pk, **merged)


def model_version_update(
    *, actor: AbstractBaseUser | None, version: ModelVersion, **changes: Any
) -> ModelVersion:
    """Change a draft version (any of :data:`VERSION_FIELDS`). Refused once it is published.

    ``version`` is refreshed in place and returned.
    """
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().select_related("model").get(pk=version.pk)
        model_version_update_validate(version=locked, **changes)
        before = _version_state(locked)
        for field, value in changes.items():
            setattr(locked, field, value)
        try:
            with transaction.atomic():
                locked.save()
        except IntegrityError as exc:
            raise ValidationError(
                {"label": "Another version of this model has that label."}
            ) from exc
        audit_record(
            actor=actor,
            action="model_version.update",
            target=locked,
            before=before,
            after=_version_state(locked),
        )
        snapshot_publish_on_commit()
    version.refresh_from_db()
    return version


def model_version_publish_validate(*, version: ModelVersion) -> None:
    """A version is publishable once its manifest is complete and its digest is the digest of
    the manifest's files (what a worker checks the artifact against, runtime.artifacts)."""
    if version.is_published:
        raise ValidationError(f"Version {version} is already published.")
    errors = v.manifest_errors(version.manifest, complete=True)
    digest_error = None
    if not v.is_sha256(version.digest):
        digest_error = "Digest must be a sha256: 64 lowercase hex digits."
    elif not errors:
        expected = manifest_digest(version.manifest["files"])
        if version.digest != expected:
            digest_error = f"Digest does not match the manifest's files: they digest to {expected}."
    cv.raise_if(
        {
            "manifest": errors,
            "digest": digest_error,
            "base_version": adapters.base_published_error(version),
        }
    )


def model_version_publish(*, actor: AbstractBaseUser | None, version: ModelVersion) -> ModelVersion:
    """Make a version routable. From here on it is immutable. ``version`` is updated in place."""
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().select_related("model").get(pk=version.pk)
        model_version_publish_validate(version=locked)
        audited_update(
            actor=actor,
            action="model_version.publish",
            target=locked,
            changes={"published_at": timezone.now()},
        )
    version.published_at = locked.published_at
    return version
