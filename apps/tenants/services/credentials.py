"""What API keys and management tokens share: both are credentials stored as a public prefix
plus a digest, with an optional expiry, revoked for good at most once."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.common.audit import audit_record
from apps.common.outbox import snapshot_publish_on_commit
from apps.tenants.models import ApiKey, ManagementToken
from apps.tenants.services.checks import Errors, add_error

PREFIX_ATTEMPTS = 5


def check_expiry(errors: Errors, expires_at: object) -> None:
    """An expiry, when given: an aware date and time in the future."""
    if expires_at is None:
        return
    if not isinstance(expires_at, datetime) or timezone.is_naive(expires_at):
        add_error(errors, "expires_at", "Expiry must be a date and time with a time zone.")
    elif expires_at <= timezone.now():
        add_error(errors, "expires_at", "Expiry must be in the future.")


def free_prefix(
    model: type[ApiKey] | type[ManagementToken], new: Callable[[], str], what: str
) -> str:
    """A fresh prefix from ``new`` that no ``model`` row holds (36**8 prefixes: a clash is
    rare, five in a row is not reached)."""
    for _ in range(PREFIX_ATTEMPTS):
        prefix = new()
        if not model._default_manager.filter(prefix=prefix).exists():
            return prefix
    raise RuntimeError(f"could not find a free {what} prefix")


def credential_revoke(
    *,
    actor: AbstractBaseUser | None,
    credential: ApiKey | ManagementToken,
    action: str,
    what: str,
    publish: bool,
) -> None:
    """Revoke for good; revoking twice is refused with "<what> '<prefix>' is already revoked."
    ``credential`` is updated in place; ``publish``: the router reads it (API keys)."""
    now = timezone.now()
    model = type(credential)
    with transaction.atomic():
        # The conditional UPDATE makes two concurrent revocations refuse one of them.
        revoked = model._default_manager.filter(pk=credential.pk, revoked_at__isnull=True).update(
            revoked_at=now
        )
        if not revoked:
            raise ValidationError(f"{what} '{credential.prefix}' is already revoked.")
        credential.revoked_at = now
        audit_record(
            actor=actor,
            action=action,
            target=credential,
            before={"revoked_at": None},
            after={"revoked_at": now},
        )
        if publish:
            snapshot_publish_on_commit()
