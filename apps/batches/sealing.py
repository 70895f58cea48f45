"""Encryption at rest of the Batch API's files (issue #32).

Every file's bytes (a batch's input, its output and error files) go to the storage sealed
with AES-GCM (:class:`runtime.crypto.Keyring`): the tenant's key, derived (HKDF) from the
at-rest keyring's primary master key and the tenant's slug, and the file's public id as the
associated data, so a stored file copied under another tenant's or another file's name does
not open. It is the router's keyring (``SWITCHYARD_AT_REST_KEYS``, else
``SWITCHYARD_AT_REST_KEYS_FILE``, else ``<var dir>/at_rest_keys``:
:func:`runtime.cache.sealing.load_keyring`), so one setting and one rotation cover the cache
and the files.

Rotation: put a new key first; new files are sealed with it, older ones still open while
their key stays in the ring. Files are kept until deleted (not a TTL as cache entries), so
before dropping an old key re-seal them: :func:`file_reseal` (``manage.py batch_files_reseal``)
rewrites every file sealed with another key than the primary.

A file stored before encryption (no ``SYE1`` header) is read as it is.
"""

from __future__ import annotations

from django.conf import settings

from runtime.cache.sealing import load_keyring
from runtime.crypto import Keyring, is_sealed, tenant_scope


def keyring() -> Keyring:
    """The at-rest keyring the settings name (read on each use: files are few and large)."""
    return load_keyring(settings.AT_REST_KEYS, settings.AT_REST_KEYS_FILE, settings.VAR_DIR)


def seal(content: bytes, *, tenant: str, file_id: str, ring: Keyring | None = None) -> bytes:
    """``content`` sealed for tenant ``tenant``'s file ``file_id`` with the primary key."""
    return (ring or keyring()).seal(content, tenant_scope(tenant), file_id.encode())


def unseal(stored: bytes, *, tenant: str, file_id: str, ring: Keyring | None = None) -> bytes:
    """The plaintext of a stored file (:class:`runtime.crypto.SealError` when it does not
    open); a file stored before encryption as it is."""
    if not is_sealed(stored):
        return stored
    return (ring or keyring()).open(stored, tenant_scope(tenant), file_id.encode())


def stale(stored: bytes, ring: Keyring) -> bool:
    """Whether a stored file should be re-sealed: plaintext, or sealed with an older key."""
    return not is_sealed(stored) or ring.stale(stored)
