"""Encryption at rest of what the cache keeps in Redis (cached completions, idempotency records).

A :class:`Sealer` wraps the :class:`runtime.crypto.Keyring`: a tenant's entries are sealed with
the tenant's derived key, entries a model shares across tenants (cache scope ``*``) with the
shared-scope key, and the Redis key the entry is stored under is the associated data (an entry
copied under another key or into another tenant does not open). L1 (in process) keeps the
decoded entry: only what leaves the process is sealed, so an L1 hit costs nothing more.

An entry that does not open (sealed with a key no longer in the ring, a plaintext one from
before encryption, an altered one) reads as absent: a cache miss, or a free idempotency key;
``switchyard_cache_unreadable_total`` counts them.

Where the keyring comes from (:func:`keyring_spec`): ``SWITCHYARD_AT_REST_KEYS``
(``"id:<base64>,id:<base64>"``, the first encrypts, all decrypt), else the file
``SWITCHYARD_AT_REST_KEYS_FILE`` names, else ``<var dir>/at_rest_keys``, which ``switchyard up``
(and a router that finds none of these) generates with one key (mode 0600) and keeps.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from runtime.crypto import (
    SHARED_SCOPE,
    Keyring,
    SealError,
    generate_key,
    tenant_scope,
    write_private_once,
)

FILE_NAME: Final = "at_rest_keys"
ENV_KEYS: Final = "SWITCHYARD_AT_REST_KEYS"
ENV_KEYS_FILE: Final = "SWITCHYARD_AT_REST_KEYS_FILE"
logger = logging.getLogger(__name__)


def scope_of(cache_scope: str) -> str:
    """The keyring scope of a cache scope (a tenant slug, or ``*`` for a shared model)."""
    return SHARED_SCOPE if cache_scope == "*" else tenant_scope(cache_scope)


class Sealer:
    """Seals and opens the bytes the cache writes to Redis (see the module)."""

    def __init__(
        self, keyring: Keyring, *, on_unreadable: Callable[[], object] | None = None
    ) -> None:
        self.keyring = keyring
        self._on_unreadable = on_unreadable  # e.g. the metric's inc

    def seal(self, plaintext: bytes, cache_scope: str, redis_key: str) -> bytes:
        return self.keyring.seal(plaintext, scope_of(cache_scope), redis_key.encode())

    def open(self, sealed: bytes, cache_scope: str, redis_key: str) -> bytes | None:
        """The plaintext, or None when the entry does not open (counted)."""
        try:
            return self.keyring.open(sealed, scope_of(cache_scope), redis_key.encode())
        except SealError as exc:
            if self._on_unreadable is not None:
                self._on_unreadable()
            logger.debug("cache: an entry under %s does not open (%s)", redis_key, exc)
            return None


def key_file(var_dir: Path) -> Path:
    return var_dir / FILE_NAME


def ensure(var_dir: Path) -> Path:
    """Generate ``<var_dir>/at_rest_keys`` (0600, one key ``k1``) unless it exists; its path."""
    path = key_file(var_dir)
    write_private_once(path, f"k1:{generate_key()}\n")
    return path


def ensure_for_up(argv: list[str], environ: Mapping[str, str], var_dir: Path) -> None:
    """Before ``up`` starts its processes: make the keys file unless the keys are set."""
    if argv[:1] != ["up"]:
        return
    if environ.get(ENV_KEYS, "").strip() or environ.get(ENV_KEYS_FILE, "").strip():
        return
    ensure(var_dir)


def keyring_spec(keys: str, keys_file: str, var_dir: Path) -> str:
    """The keyring setting: ``keys`` when set, else the file ``keys_file`` names, else the var
    directory's file (generated when missing, with a warning: routers that share a Redis must
    share the keys, else each reads the others' entries as misses)."""
    if keys.strip():
        return keys
    if keys_file.strip():
        return Path(keys_file).read_text(encoding="utf-8")
    path = key_file(var_dir)
    if not path.is_file():
        ensure(var_dir)
        logger.warning(
            "no SWITCHYARD_AT_REST_KEYS: generated %s; routers sharing a Redis need the same keys",
            path,
        )
    return path.read_text(encoding="utf-8")


def load_keyring(keys: str, keys_file: str, var_dir: Path) -> Keyring:
    """The keyring the settings name (:func:`keyring_spec`); KeyringError/OSError when bad."""
    return Keyring.from_spec(keyring_spec(keys, keys_file, var_dir).replace("\n", ","))
