"""Encryption at rest: per-tenant keys, shared scope, rotation, tamper detection, bad settings."""

from __future__ import annotations

import base64

import pytest

from runtime.crypto import (
    SHARED_SCOPE,
    Keyring,
    KeyringError,
    SealError,
    generate_key,
    is_sealed,
    tenant_scope,
)

pytestmark = pytest.mark.unit

K1, K2 = generate_key(), generate_key()
SECRET = b'{"choices": [{"text": "the answer is 42"}]}'
ACME, GLOBEX = tenant_scope("acme"), tenant_scope("globex")


def test_round_trip_and_the_plaintext_is_not_in_the_entry() -> None:
    ring = Keyring.from_spec(f"k1:{K1}")
    sealed = ring.seal(SECRET, ACME, aad=b"cache:abc")
    assert is_sealed(sealed)
    assert not is_sealed(SECRET)
    assert b"42" not in sealed
    assert b"answer" not in sealed
    assert ring.open(sealed, ACME, aad=b"cache:abc") == SECRET
    assert ring.seal(SECRET, ACME) != ring.seal(SECRET, ACME)  # a fresh nonce each time


def test_another_tenant_or_record_cannot_open_it() -> None:
    ring = Keyring.from_spec(f"k1:{K1}")
    sealed = ring.seal(SECRET, ACME, aad=b"cache:abc")
    for scope, aad in ((GLOBEX, b"cache:abc"), (SHARED_SCOPE, b"cache:abc"), (ACME, b"cache:xyz")):
        with pytest.raises(SealError, match="does not authenticate"):
            ring.open(sealed, scope, aad=aad)
    shared = ring.seal(SECRET, SHARED_SCOPE)
    assert ring.open(shared, SHARED_SCOPE) == SECRET


@pytest.mark.parametrize("index", [0, 5, 20, -1], ids=["magic", "key-id", "nonce", "tag"])
def test_a_flipped_bit_is_detected(index: int) -> None:
    ring = Keyring.from_spec(f"k1:{K1}")
    sealed = bytearray(ring.seal(SECRET, ACME))
    sealed[index] ^= 0x01
    with pytest.raises(SealError):
        ring.open(bytes(sealed), ACME)


def test_rotation_new_primary_seals_old_keys_still_open() -> None:
    old = Keyring.from_spec(f"k1:{K1}")
    before = old.seal(SECRET, ACME)
    rotated = Keyring.from_spec(f"k2:{K2}, k1:{K1}")
    after = rotated.seal(SECRET, ACME)
    assert rotated.open(before, ACME) == SECRET
    assert rotated.stale(before)
    assert not rotated.stale(after)
    assert after[5:7] == b"k2"  # the key id is in the header
    with pytest.raises(SealError, match="key 'k2', which the keyring does not hold"):
        old.open(after, ACME)
    retired = Keyring.from_spec(f"k2:{K2}")
    with pytest.raises(SealError, match="'k1'"):
        retired.open(before, ACME)


def test_not_sealed_or_truncated() -> None:
    ring = Keyring.from_spec(f"k1:{K1}")
    with pytest.raises(SealError, match="not a sealed entry"):
        ring.open(SECRET, ACME)
    with pytest.raises(SealError, match="truncated"):
        ring.open(ring.seal(b"", ACME)[:20], ACME)


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ("", "no key"),
        ("k1", "expected 'id:<base64 key>'"),
        ("k1:not base64!", "not base64"),
        (f"k1:{base64.b64encode(b'short').decode()}", "at least 32 bytes"),
        (f"k1:{K1},k1:{K2}", "twice"),
        (f"bad id:{K1}", "letters, digits"),
    ],
)
def test_bad_keyring_settings_are_refused_clearly(spec: str, words: str) -> None:
    with pytest.raises(KeyringError, match=words.replace("(", r"\(").replace(")", r"\)")):
        Keyring.from_spec(spec)


def test_tenant_scope_needs_a_slug() -> None:
    with pytest.raises(ValueError, match="slug"):
        tenant_scope("")
