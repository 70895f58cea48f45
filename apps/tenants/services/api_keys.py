"""API keys: issued once in full, stored as a public prefix plus a sha256 digest.

The key format and digest are the router's too: both come from :mod:`runtime.contract`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.db.models import Q

from apps.common.audit import audit_record
from apps.common.outbox import snapshot_publish_on_commit
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.services.checks import Errors, add_error, check_text
from apps.tenants.services.credentials import check_expiry, credential_revoke, free_prefix
from runtime import contract

API_KEY_SCOPES = ("inference", "models:read", "usage:read")


def api_key_digest(full_key: str) -> str:
    """The stored form of a key: hex sha256 of the whole key string (the router's too)."""
    return contract.api_key_digest(full_key)


def api_key_validate_values(values: Mapping[str, Any]) -> None:
    """Check name, scopes and expires_at where present; raise a per-field ValidationError."""
    errors: Errors = {}
    if "name" in values:
        check_text(errors, "name", values["name"], max_length=100)
    if "scopes" in values:
        scopes = values["scopes"]
        if isinstance(scopes, str) or not isinstance(scopes, Iterable):
            add_error(errors, "scopes", "Scopes must be a list, for example ['inference'].")
        else:
            scopes = list(scopes)
            unknown = sorted({str(s) for s in scopes} - set(API_KEY_SCOPES))
            if unknown:
                add_error(
                    errors,
                    "scopes",
                    f"Unknown scope(s): {', '.join(unknown)}. "
                    f"Allowed: {', '.join(API_KEY_SCOPES)}.",
                )
            elif not scopes:
                add_error(errors, "scopes", "An API key needs at least one scope.")
    check_expiry(errors, values.get("expires_at"))
    if errors:
        raise ValidationError(errors)


def _new_prefix() -> str:
    return free_prefix(ApiKey, contract.api_key_new_prefix, "API-key")


def api_key_create(
    *,
    actor: AbstractBaseUser | None,
    tenant: Tenant,
    name: str,
    scopes: Iterable[str] = ("inference",),
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Issue a key. Returns the stored key and the full key string, which is never stored:
    show it to the caller once."""
    api_key_validate_values({"name": name, "scopes": scopes, "expires_at": expires_at})
    scope_list = list(dict.fromkeys(scopes))
    prefix = _new_prefix()
    full_key = contract.api_key_new(prefix)
    with transaction.atomic():
        api_key = ApiKey.objects.create(
            tenant=tenant,
            name=name,
            prefix=prefix,
            digest=api_key_digest(full_key),
            scopes=scope_list,
            expires_at=expires_at,
        )
        after = {
            "tenant": tenant.slug,
            "name": name,
            "prefix": prefix,
            "scopes": scope_list,
            "expires_at": expires_at,
        }
        audit_record(actor=actor, action="api_key.create", target=api_key, after=after)
        snapshot_publish_on_commit()
    return api_key, full_key


def api_key_revoke(*, actor: AbstractBaseUser | None, api_key: ApiKey) -> ApiKey:
    """Revoke a key for good; revoking a key twice is refused."""
    credential_revoke(
        actor=actor, credential=api_key, action="api_key.revoke", what="API key", publish=True
    )
    return api_key


def api_key_touch(*, prefix: str, used_at: datetime) -> None:
    """Record that a key was used (one UPDATE; never moves last_used_at backwards).

    Bookkeeping only: no audit event and no snapshot.
    """
    ApiKey.objects.filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=used_at), prefix=prefix
    ).update(last_used_at=used_at)
