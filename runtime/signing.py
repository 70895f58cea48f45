"""Artifact signatures: Ed25519 over a model version's manifest digest.

What is signed: the ASCII bytes ``switchyard-artifact-v1:<digest>``, where ``<digest>`` is the
version's manifest digest (64 lowercase hex digits, :func:`runtime.artifacts.manifest_digest`).
The prefix keeps a signature made for Switchyard artifacts from meaning anything elsewhere.

Encodings (all standard base64 with padding):

- a public key is its 32 raw bytes (44 characters); :func:`parse_public_key` also reads the PEM
  ``-----BEGIN PUBLIC KEY-----`` that ``openssl pkey -pubout`` writes and normalises it;
- a signature is its 64 raw bytes (88 characters);
- a private key is an unencrypted PKCS#8 PEM file (``openssl genpkey -algorithm ed25519``).

The registry holds the trusted public keys by name and each version's signature with the name
of the key that made it; a worker checks the signature (:func:`check_signature`) before it
hashes the artifact folder. No Django here: the data plane imports this.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

SIGNED_PREFIX = b"switchyard-artifact-v1:"
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64


class SignatureError(Exception):
    """A key or signature cannot be used, or a signature does not verify."""


class KeyFileExistsError(SignatureError):
    """A new private key file would overwrite an existing file."""


class UnsignedArtifactError(SignatureError):
    """The version carries no signature and signatures are required."""


class UntrustedKeyError(SignatureError):
    """The signature names a key the registry does not trust (unknown or inactive)."""


class BadSignatureError(SignatureError):
    """The signature does not verify against the digest with the named key."""


def signed_message(digest: str) -> bytes:
    """The bytes an artifact signature covers (see the module docstring)."""
    return SIGNED_PREFIX + digest.encode("ascii")


def _b64decode(text: str, what: str) -> bytes:
    try:
        return base64.b64decode(text.strip(), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise SignatureError(f"{what} is not valid base64") from exc


def parse_public_key(text: str) -> str:
    """A public key as the registry stores it (base64 of the 32 raw bytes), from that form or
    a PEM ``PUBLIC KEY``. Raises :class:`SignatureError` saying what is wrong."""
    text = text.strip()
    if text.startswith("-----BEGIN"):
        try:
            key = serialization.load_pem_public_key(text.encode("ascii"))
        except (ValueError, UnicodeEncodeError) as exc:
            raise SignatureError("not a readable PEM public key") from exc
        if not isinstance(key, Ed25519PublicKey):
            raise SignatureError("the PEM key is not an Ed25519 public key")
        return public_key_text(key)
    raw = _b64decode(text, "the public key")
    if len(raw) != PUBLIC_KEY_BYTES:
        raise SignatureError(
            f"an Ed25519 public key is {PUBLIC_KEY_BYTES} bytes (44 base64 characters), "
            f"this one is {len(raw)}"
        )
    return base64.b64encode(raw).decode("ascii")


def public_key_text(key: Ed25519PublicKey | Ed25519PrivateKey) -> str:
    """The registry's form of a key's public half."""
    public = key.public_key() if isinstance(key, Ed25519PrivateKey) else key
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode("ascii")


def key_fingerprint(public_key: str) -> str:
    """The first 16 hex digits of the sha256 of a public key's raw bytes (names, log lines)."""
    return hashlib.sha256(_b64decode(public_key, "the public key")).hexdigest()[:16]


def generate_private_key() -> tuple[Ed25519PrivateKey, bytes]:
    """A new key and its unencrypted PKCS#8 PEM."""
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return key, pem


def create_private_key_file(path: Path) -> Ed25519PrivateKey:
    """Generate a key into a new PEM file (mode 0600); an existing file is never overwritten
    (:class:`SignatureError`)."""
    path = Path(path)
    key, pem = generate_private_key()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError as exc:
        raise KeyFileExistsError(f"{path} already exists; not overwriting a private key") from exc
    except OSError as exc:
        raise SignatureError(f"cannot create {path}: {exc.strerror or exc}") from exc
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    return key


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """An Ed25519 private key from an unencrypted PEM file."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise SignatureError(f"cannot read the private key {path}: {exc.strerror or exc}") from exc
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise SignatureError(f"{path} is not an unencrypted PEM private key ({exc})") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise SignatureError(f"{path} holds a {type(key).__name__}, not an Ed25519 key")
    return key


def sign_digest(key: Ed25519PrivateKey, digest: str) -> str:
    """The base64 signature of ``digest`` (see the module docstring)."""
    return base64.b64encode(key.sign(signed_message(digest))).decode("ascii")


def verify_signature(public_key: str, digest: str, signature: str) -> None:
    """Raise :class:`BadSignatureError` unless ``signature`` is ``public_key``'s over ``digest``."""
    raw_key = _b64decode(public_key, "the public key")
    raw_signature = _b64decode(signature, "the signature")
    if len(raw_signature) != SIGNATURE_BYTES:
        raise BadSignatureError(
            f"an Ed25519 signature is {SIGNATURE_BYTES} bytes, this one is {len(raw_signature)}"
        )
    try:
        Ed25519PublicKey.from_public_bytes(raw_key).verify(raw_signature, signed_message(digest))
    except (InvalidSignature, ValueError) as exc:
        raise BadSignatureError(
            f"the signature does not verify against digest {digest} with that key"
        ) from exc


@dataclass(frozen=True, kw_only=True)
class SignatureCheck:
    """What a worker checks a version's signature with, all read from the registry.

    ``trusted`` maps the names of the registry's active keys to their public keys;
    ``key_name``/``signature`` are the version's (empty: unsigned). ``required=False`` lets an
    unsigned version through (a present signature is still checked).
    """

    required: bool
    key_name: str = ""
    signature: str = ""
    trusted: Mapping[str, str] = field(default_factory=dict)


def check_signature(check: SignatureCheck, digest: str) -> str | None:
    """Verify ``check`` for ``digest``; return the key's name, or None for an unsigned version
    let through. Raises :class:`UnsignedArtifactError`, :class:`UntrustedKeyError` or
    :class:`BadSignatureError`."""
    if not check.signature:
        if check.required:
            raise UnsignedArtifactError(
                "the version is not signed and artifact signatures are required "
                "(sign it: manage.py sign_artifact MODEL LABEL --key PRIVATE_KEY.pem)"
            )
        return None
    public_key = check.trusted.get(check.key_name)
    if public_key is None:
        raise UntrustedKeyError(
            f"the version is signed with key {check.key_name or '(none)'!r}, which the "
            "registry does not trust (unknown or inactive)"
        )
    verify_signature(public_key, digest, check.signature)
    return check.key_name
