"""Rotating an API key: a new key with the same name and scopes; the old one keeps working
for an overlap window (its expiry moves to the end of the window), so clients can switch."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from apps.common.audit import audit_record
from apps.common.outbox import snapshot_publish_on_commit
from apps.tenants.models import ApiKey
from apps.tenants.services.api_keys import api_key_create

MAX_OVERLAP_S = 30 * 24 * 3600


def api_key_rotate_validate(*, api_key: ApiKey, overlap_s: int) -> None:
    if isinstance(overlap_s, bool) or not isinstance(overlap_s, int):
        raise ValidationError({"overlap_s": "Overlap must be a whole number of seconds."})
    if not 0 <= overlap_s <= MAX_OVERLAP_S:
        raise ValidationError(
            {"overlap_s": f"Overlap must be from 0 to {MAX_OVERLAP_S} seconds (30 days)."}
        )
    if api_key.revoked_at is not None:
        raise ValidationError(f"API key '{api_key.prefix}' is revoked; it cannot be rotated.")
    if api_key.expires_at is not None and api_key.expires_at <= timezone.now():
        raise ValidationError(f"API key '{api_key.prefix}' has expired; it cannot be rotated.")


def api_key_rotate(
    *, actor: AbstractBaseUser | None, api_key: ApiKey, overlap_s: int
) -> tuple[ApiKey, str]:
    """Issue the successor of ``api_key`` and let the old key expire after ``overlap_s``.

    The old key's expiry only ever moves earlier. With ``overlap_s=0`` the old key stops at
    once (it is expired, not revoked, so its history reads "rotated"). Returns the new key and
    its full string (shown once).
    """
    with transaction.atomic():
        locked = ApiKey.objects.select_for_update().select_related("tenant").get(pk=api_key.pk)
        api_key_rotate_validate(api_key=locked, overlap_s=overlap_s)
        now = timezone.now()
        ends = now + timedelta(seconds=overlap_s)
        before = locked.expires_at
        if before is None or ends < before:
            locked.expires_at = ends
            locked.save(update_fields=["expires_at"])
        successor_expiry = before if before is not None and before > ends else None
        successor, full_key = api_key_create(
            actor=actor,
            tenant=locked.tenant,
            name=locked.name,
            scopes=locked.scopes,
            expires_at=successor_expiry,
        )
        audit_record(
            actor=actor,
            action="api_key.rotate",
            target=locked,
            before={"expires_at": before},
            after={"expires_at": locked.expires_at, "successor": successor.prefix},
        )
        snapshot_publish_on_commit()
    api_key.expires_at = locked.expires_at
    return successor, full_key
