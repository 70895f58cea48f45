"""Encryption at rest: AES-GCM with per-tenant keys derived from a rotating keyring.

What the data plane stores for a tenant (cached completions, idempotency records) is sealed
with :meth:`Keyring.seal` and read back with :meth:`Keyring.open`. The keyring holds named
master keys (from settings: ``"k2:<base64>,k1:<base64>"``, the first one is the *primary*);
each entry's key is HKDF-SHA256(master, info=scope), the scope being a tenant
(:func:`tenant_scope`) or :data:`SHARED_SCOPE` for entries a model shares across tenants.

Format of a sealed entry::

    b"SYE1" | key-id length (1 byte) | key id (ASCII) | nonce (12 bytes) | ciphertext + tag

The AES-GCM associated data is the header, the scope and the caller's ``aad`` (e.g. the cache
key), so an entry moved to another tenant or another key, or altered by one bit, does not open
(:class:`SealError` says so). Rotation: put a new key first; new entries use it, entries sealed
with an older key still open as long as that key stays in the ring (:meth:`Keyring.stale` tells
a reader to re-seal).
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import re
from pathlib import Path
from typing import Final

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

MAGIC: Final = b"SYE1"
NONCE_LEN: Final = 12
MIN_MASTER_LEN: Final = 32
SHARED_SCOPE: Final = "shared"
_SALT: Final = b"switchyard/at-rest/v1"
_KEY_ID = re.compile(r"[A-Za-z0-9_-]{1,32}")


class KeyringError(ValueError):
    """A keyring setting that cannot be used (the message says which part and why)."""


class SealError(ValueError):
    """An entry that cannot be opened: not sealed, an unknown key, or altered / wrong scope."""


def tenant_scope(slug: str) -> str:
    """The scope of one tenant's entries."""
    if not slug:
        raise ValueError("a tenant scope needs the tenant's slug")
    return f"tenant:{slug}"


def write_private_once(path: Path, text: str) -> bool:
    """Create ``path`` (mode 0600) holding ``text`` unless it exists; True when created. Two
    processes racing both end up with the one file written first (O_EXCL); a failed write
    leaves no file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    return True


def generate_key() -> str:
    """A new random master key, base64 (for the keyring setting)."""
    return base64.b64encode(os.urandom(32)).decode()


class Keyring:
    """Named master keys, the first one primary; derived keys are cached per (key, scope)."""

    def __init__(self, keys: list[tuple[str, bytes]]) -> None:
        if not keys:
            raise KeyringError("the keyring holds no key")
        self._masters: dict[str, bytes] = {}
        for key_id, master in keys:
            if not _KEY_ID.fullmatch(key_id):
                raise KeyringError(f"key id {key_id!r}: 1-32 letters, digits, '_' or '-'")
            if key_id in self._masters:
                raise KeyringError(f"key id {key_id!r} appears twice")
            if len(master) < MIN_MASTER_LEN:
                raise KeyringError(f"key {key_id!r}: at least {MIN_MASTER_LEN} bytes")
            self._masters[key_id] = master
        self.primary = keys[0][0]
        self._aeads: dict[tuple[str, str], AESGCM] = {}

    @classmethod
    def from_spec(cls, spec: str) -> Keyring:
        """Parse ``"id:<base64>,id:<base64>"`` (the first is primary); blanks are ignored."""
        keys: list[tuple[str, bytes]] = []
        for i, item in enumerate(part.strip() for part in spec.split(",")):
            if not item:
                continue
            key_id, sep, encoded = item.partition(":")
            if not sep:
                raise KeyringError(f"keyring entry {i}: expected 'id:<base64 key>'")
            try:
                master = base64.b64decode(encoded.strip(), validate=True)
            except (binascii.Error, ValueError) as exc:
                raise KeyringError(f"key {key_id.strip()!r}: not base64 ({exc})") from None
            keys.append((key_id.strip(), master))
        return cls(keys)

    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._masters)

    def _aead(self, key_id: str, scope: str) -> AESGCM:
        found = self._aeads.get((key_id, scope))
        if found is None:
            derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=_SALT,
                           info=scope.encode()).derive(self._masters[key_id])  # fmt: skip
            found = self._aeads[key_id, scope] = AESGCM(derived)
        return found

    def seal(self, plaintext: bytes, scope: str, aad: bytes = b"") -> bytes:
        """``plaintext`` encrypted for ``scope`` with the primary key."""
        key_id = self.primary.encode()
        header = MAGIC + bytes((len(key_id),)) + key_id + os.urandom(NONCE_LEN)
        nonce = header[-NONCE_LEN:]
        return header + self._aead(self.primary, scope).encrypt(
            nonce, plaintext, _associated(header, scope, aad)
        )

    def open(self, sealed: bytes, scope: str, aad: bytes = b"") -> bytes:
        """The plaintext of an entry sealed for ``scope`` with ``aad``; :class:`SealError` else."""
        key_id, header = self._header(sealed)
        nonce = header[-NONCE_LEN:]
        try:
            return self._aead(key_id, scope).decrypt(
                nonce, sealed[len(header) :], _associated(header, scope, aad)
            )
        except InvalidTag:
            raise SealError(
                f"entry sealed with key {key_id!r} does not authenticate: it was altered, "
                "or it belongs to another scope or record"
            ) from None

    def stale(self, sealed: bytes) -> bool:
        """True when the entry was sealed with a key other than the primary (re-seal it)."""
        return self._header(sealed)[0] != self.primary

    def _header(self, sealed: bytes) -> tuple[str, bytes]:
        if not sealed.startswith(MAGIC) or len(sealed) < len(MAGIC) + 1:
            raise SealError("not a sealed entry (no SYE1 header)")
        size = sealed[len(MAGIC)]
        end = len(MAGIC) + 1 + size + NONCE_LEN
        if len(sealed) < end + 16:  # the GCM tag is 16 bytes
            raise SealError("sealed entry is truncated")
        key_id = sealed[len(MAGIC) + 1 : len(MAGIC) + 1 + size].decode("ascii", "replace")
        if key_id not in self._masters:
            raise SealError(f"entry sealed with key {key_id!r}, which the keyring does not hold")
        return key_id, sealed[:end]


def is_sealed(raw: bytes) -> bool:
    """Whether ``raw`` looks like a sealed entry (a plaintext one from before encryption: no)."""
    return raw.startswith(MAGIC)


def _associated(header: bytes, scope: str, aad: bytes) -> bytes:
    scope_bytes = scope.encode()
    return header + len(scope_bytes).to_bytes(2, "big") + scope_bytes + aad
