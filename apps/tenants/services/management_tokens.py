"""Management tokens: a tenant's credentials for the REST API, separate from inference keys.

Issued once in full (``sym_<prefix>_<secret>``), stored as the public prefix plus a sha256
digest. A token carries one role (owner/admin/viewer) in one tenant.
"""

from __future__ import annotations

import hashlib
import secrets
import string
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q

from apps.common.audit import audit_record
from apps.tenants.models import ManagementToken, Membership, Tenant
from apps.tenants.services.checks import Errors, add_error, check_text
from apps.tenants.services.credentials import check_expiry, credential_revoke, free_prefix

TOKEN_SCHEME = "sym"  # noqa: S105 - the token format's scheme, not a secret
_PREFIX_ALPHABET = string.ascii_lowercase + string.digits
_SECRET_ALPHABET = string.ascii_letters + string.digits
_PREFIX_LENGTH = 8
_SECRET_LENGTH = 40


def management_token_digest(full_token: str) -> str:
    """The stored form of a token: hex sha256 of the whole token string."""
    return hashlib.sha256(full_token.encode()).hexdigest()


def management_token_split(full_token: str) -> str | None:
    """The public prefix of a well-formed token string, or None."""
    scheme, _, rest = full_token.partition("_")
    prefix, _, secret = rest.partition("_")
    if (
        scheme != TOKEN_SCHEME
        or len(prefix) != _PREFIX_LENGTH
        or len(secret) != _SECRET_LENGTH
        or not secret.isalnum()
    ):
        return None
    return prefix


def management_token_validate_values(values: Mapping[str, Any]) -> None:
    """Check name, role and expires_at where present; raise a per-field ValidationError."""
    errors: Errors = {}
    if "name" in values:
        check_text(errors, "name", values["name"], max_length=100)
    if "role" in values and values["role"] not in Membership.Role.values:
        add_error(errors, "role", f"Role must be one of: {', '.join(Membership.Role.values)}.")
    check_expiry(errors, values.get("expires_at"))
    if errors:
        raise ValidationError(errors)


def _random_prefix() -> str:
    return "".join(secrets.choice(_PREFIX_ALPHABET) for _ in range(_PREFIX_LENGTH))


def _new_prefix() -> str:
    return free_prefix(ManagementToken, _random_prefix, "management-token")


def management_token_create(
    *,
    actor: AbstractBaseUser | None,
    tenant: Tenant,
    name: str,
    role: str,
    expires_at: datetime | None = None,
) -> tuple[ManagementToken, str]:
    """Issue a token. Returns the stored token and the full token string (show it once)."""
    management_token_validate_values({"name": name, "role": role, "expires_at": expires_at})
    prefix = _new_prefix()
    secret = "".join(secrets.choice(_SECRET_ALPHABET) for _ in range(_SECRET_LENGTH))
    full_token = f"{TOKEN_SCHEME}_{prefix}_{secret}"
    with transaction.atomic():
        token = ManagementToken.objects.create(
            tenant=tenant,
            name=name,
            role=role,
            prefix=prefix,
            digest=management_token_digest(full_token),
            created_by_id=actor.pk if actor is not None else None,
            expires_at=expires_at,
        )
        after = {"tenant": tenant.slug, "name": name, "role": role, "prefix": prefix}
        audit_record(actor=actor, action="management_token.create", target=token, after=after)
    return token, full_token


def management_token_revoke(
    *, actor: AbstractBaseUser | None, token: ManagementToken
) -> ManagementToken:
    """Revoke a token for good; revoking it twice is refused."""
    credential_revoke(
        actor=actor,
        credential=token,
        action="management_token.revoke",
        what="Management token",
        publish=False,
    )
    return token


def management_token_touch(*, token: ManagementToken, used_at: datetime) -> None:
    """Record a use (bookkeeping: one conditional UPDATE, at most once a minute per token)."""
    stale = used_at - timedelta(minutes=1)
    ManagementToken.objects.filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale), pk=token.pk
    ).update(last_used_at=used_at)
