"""Registry services for artifact signatures: the trusted keys and each version's signature.

What is signed and how keys and signatures are encoded: :mod:`runtime.signing`. A key's bytes
never change once registered (a different key is a new row); turning a key inactive makes
workers refuse the versions it signed from their next start. A signature may be added to a
published version: it does not change what the version serves, only vouches for its digest.
Neither write touches the router's snapshot (workers read keys and signatures at start).
"""

from __future__ import annotations

import re

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import IntegrityError, transaction

from apps.common import validation as cv
from apps.common.audit import audit_record, audit_state
from apps.common.validation import exists_other
from apps.models.models import ModelVersion, TrustedKey
from apps.models.validators import is_sha256
from runtime.signing import (
    SignatureError,
    parse_public_key,
    public_key_text,
    sign_digest,
    verify_signature,
)

KEY_FIELDS = ("name", "public_key", "active")
KEY_NAME_RE = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?$")


def trusted_key_name_error(name: object, exclude_pk: int | None = None) -> str | None:
    if not isinstance(name, str) or not KEY_NAME_RE.fullmatch(name):
        return (
            "Key name must be 1-63 characters of lowercase letters, digits or '-', starting "
            "and ending with a letter or digit."
        )
    if exists_other(TrustedKey.objects.filter(name=name), exclude_pk):
        return f"A trusted key named {name!r} already exists."
    return None


def trusted_key_validate(*, name: object, public_key: object, exclude_pk: int | None = None) -> str:
    """Check a new key; return its public key in the registry's form (base64 of the raw bytes).
    Raises ValidationError keyed by field."""
    key_error = None
    normalised = ""
    if not isinstance(public_key, str):
        key_error = "Public key must be a string."
    else:
        try:
            normalised = parse_public_key(public_key)
        except SignatureError as exc:
            key_error = f"Not an Ed25519 public key: {exc}."
        else:
            other = TrustedKey.objects.filter(public_key=normalised)
            if exists_other(other, exclude_pk):
                key_error = f"This key is already trusted as {other.first()}."
    cv.raise_if({"name": trusted_key_name_error(name, exclude_pk), "public_key": key_error})
    return normalised


def trusted_key_create(
    *, actor: AbstractBaseUser | None, name: str, public_key: str, active: bool = True
) -> TrustedKey:
    normalised = trusted_key_validate(name=name, public_key=public_key)
    cv.raise_if({"active": cv.bool_error(active)})
    with transaction.atomic():
        try:
            with transaction.atomic():
                key = TrustedKey.objects.create(name=name, public_key=normalised, active=active)
        except IntegrityError as exc:
            raise ValidationError({"name": "That name or key is already trusted."}) from exc
        audit_record(
            actor=actor, action="trusted_key.create", target=key, after=audit_state(key, KEY_FIELDS)
        )
    return key


def trusted_key_set_active(
    *, actor: AbstractBaseUser | None, key: TrustedKey, active: bool
) -> TrustedKey:
    """Trust or distrust ``key`` (its name and bytes never change); refreshed in place."""
    cv.raise_if({"active": cv.bool_error(active)})
    with transaction.atomic():
        locked = TrustedKey.objects.select_for_update().get(pk=key.pk)
        if locked.active != active:
            locked.active = active
            locked.save(update_fields=["active"])
            audit_record(
                actor=actor,
                action="trusted_key.update",
                target=locked,
                before={"active": not active},
                after={"active": active},
            )
    key.refresh_from_db()
    return key


def model_version_sign_validate(*, version: ModelVersion, key: TrustedKey, signature: str) -> None:
    """The signature must be ``key``'s (an active key) over the version's digest."""
    if not key.active:
        cv.raise_if({"key": f"Key {key} is inactive; workers would refuse its signature."})
    if not is_sha256(version.digest):
        cv.raise_if({"digest": "The version has no valid digest to sign."})
    try:
        verify_signature(key.public_key, version.digest, signature)
    except SignatureError as exc:
        raise ValidationError({"signature": f"{exc}."}) from exc


def model_version_sign(
    *, actor: AbstractBaseUser | None, version: ModelVersion, key: TrustedKey, signature: str
) -> ModelVersion:
    """Record ``key``'s ``signature`` over the version's digest (replacing an earlier one);
    ``version`` is updated in place."""
    signature = signature.strip() if isinstance(signature, str) else signature
    with transaction.atomic():
        locked = ModelVersion.objects.select_for_update().select_related("model").get(pk=version.pk)
        model_version_sign_validate(version=locked, key=key, signature=signature)
        before = {"signing_key": str(locked.signing_key or ""), "signature": locked.signature}
        locked.signing_key = key
        locked.signature = signature
        locked.save(update_fields=["signing_key", "signature"])
        audit_record(
            actor=actor,
            action="model_version.sign",
            target=locked,
            before=before,
            after={"signing_key": key.name, "signature": signature, "digest": locked.digest},
        )
    version.signing_key = key
    version.signature = signature
    return version


def model_version_sign_with(
    *, actor: AbstractBaseUser | None, version: ModelVersion, private_key: Ed25519PrivateKey
) -> ModelVersion:
    """Sign the version's digest with ``private_key``, whose public half must be a trusted key
    (``manage.py sign_artifact``, the demo seed)."""
    public_key = public_key_text(private_key)
    key = TrustedKey.objects.filter(public_key=public_key).first()
    if key is None:
        raise ValidationError(
            {
                "key": f"The registry does not trust this key (public key {public_key}); add it "
                "first (admin, REST /api/v1/ops/trusted-keys/ or manage.py make_signing_key)."
            }
        )
    signature = sign_digest(private_key, version.digest)
    return model_version_sign(actor=actor, version=version, key=key, signature=signature)


def artifact_refused_record(*, version: ModelVersion, worker: str, reason: str) -> None:
    """The registry's event for a worker that refused to serve ``version`` (an unsigned or
    badly signed artifact, or one that differs from its digest): an audit event on the version
    (``model_version.artifact_refused``, in the admin's and the REST API's audit log)."""
    audit_record(
        actor=None,
        action="model_version.artifact_refused",
        target=version,
        after={"worker": worker, "reason": reason},
    )
