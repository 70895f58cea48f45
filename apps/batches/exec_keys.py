"""The executor's credentials: a tenant API key minted for one batch.

The executor sends a batch's lines to the router's public endpoint like any client, so they
pass the same authentication, limits, class, fairness and metering as online requests. The key
is minted with the batch (scope ``inference``, expiring an hour after the completion window),
stored sealed (AES-GCM, :mod:`runtime.crypto`, keyed from the control plane's ``SECRET_KEY``),
and revoked when the batch ends. It is never shown to anyone.
"""

from __future__ import annotations

import contextlib
import hashlib
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ValidationError

from apps.batches.models import Batch
from apps.tenants.models import ApiKey, Tenant
from apps.tenants.services import api_key_create, api_key_revoke
from runtime.crypto import Keyring, tenant_scope

KEY_SLACK = timedelta(hours=1)


def _keyring() -> Keyring:
    master = hashlib.sha256(b"switchyard/batch-keys\n" + settings.SECRET_KEY.encode()).digest()
    return Keyring([("sk1", master)])


def mint(tenant: Tenant, batch_id: str, expires_at: datetime) -> tuple[str, bytes]:
    """A new key for the batch: its prefix and the sealed full key."""
    api_key, full_key = api_key_create(
        actor=None, tenant=tenant, name=f"batch {batch_id}"[:100], expires_at=expires_at + KEY_SLACK
    )
    sealed = _keyring().seal(full_key.encode(), tenant_scope(tenant.slug), batch_id.encode())
    return api_key.prefix, sealed


def unseal(batch: Batch) -> str:
    sealed = bytes(batch.exec_key_sealed or b"")
    scope = tenant_scope(batch.tenant.slug)
    return _keyring().open(sealed, scope, batch.public_id.encode()).decode()


def revoke(batch: Batch) -> None:
    """Revoke the batch's key (once the batch is over); a key already revoked is left."""
    key = ApiKey.objects.filter(prefix=batch.exec_key_prefix, revoked_at__isnull=True).first()
    if key is not None:
        with contextlib.suppress(ValidationError):  # revoked meanwhile
            api_key_revoke(actor=None, api_key=key)
