"""runtime.signing: Ed25519 signatures over an artifact's manifest digest, and the check a
worker makes before loading (ReplicaLife.verify)."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import stat
from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization

from runtime.artifacts import compute_manifest
from runtime.signing import (
    BadSignatureError,
    KeyFileExistsError,
    SignatureCheck,
    SignatureError,
    UnsignedArtifactError,
    UntrustedKeyError,
    check_signature,
    create_private_key_file,
    generate_private_key,
    load_private_key,
    parse_public_key,
    public_key_text,
    sign_digest,
    signed_message,
    verify_signature,
)
from runtime.workers.replica import ArtifactRefusedError, ReplicaLife, ReplicaSpec

pytestmark = pytest.mark.unit

DIGEST = hashlib.sha256(b"an artifact").hexdigest()


@pytest.fixture
def key():
    return generate_private_key()[0]


def check_for(key, digest: str = DIGEST, *, name: str = "release", required: bool = True):
    return SignatureCheck(
        required=required,
        key_name=name,
        signature=sign_digest(key, digest),
        trusted={"release": public_key_text(key)},
    )


def test_what_is_signed_is_the_prefixed_digest(key):
    signature = base64.b64decode(sign_digest(key, DIGEST))
    assert signed_message(DIGEST) == f"switchyard-artifact-v1:{DIGEST}".encode()
    key.public_key().verify(signature, signed_message(DIGEST))  # raises if not
    assert len(signature) == 64


def test_sign_then_verify_good(key):
    verify_signature(public_key_text(key), DIGEST, sign_digest(key, DIGEST))
    assert check_signature(check_for(key), DIGEST) == "release"


def test_tampered_digest_is_refused(key):
    other = hashlib.sha256(b"another artifact").hexdigest()
    with pytest.raises(BadSignatureError, match=f"does not verify against digest {other}"):
        check_signature(check_for(key), other)


def test_a_signature_by_another_key_is_refused(key):
    impostor = generate_private_key()[0]
    check = SignatureCheck(
        required=True,
        key_name="release",
        signature=sign_digest(impostor, DIGEST),
        trusted={"release": public_key_text(key)},
    )
    with pytest.raises(BadSignatureError):
        check_signature(check, DIGEST)


def test_unknown_key_is_refused(key):
    with pytest.raises(UntrustedKeyError, match="'retired', which the registry does not trust"):
        check_signature(check_for(key, name="retired"), DIGEST)


@pytest.mark.parametrize("garbage", ["not base64!", base64.b64encode(b"short").decode()])
def test_a_malformed_signature_is_refused(key, garbage):
    check = SignatureCheck(
        required=True,
        key_name="release",
        signature=garbage,
        trusted={"release": public_key_text(key)},
    )
    with pytest.raises(SignatureError):
        check_signature(check, DIGEST)


def test_unsigned_is_refused_when_required_and_let_through_when_optional():
    with pytest.raises(UnsignedArtifactError, match="not signed and artifact signatures are"):
        check_signature(SignatureCheck(required=True), DIGEST)
    assert check_signature(SignatureCheck(required=False), DIGEST) is None


def test_optional_still_checks_a_present_signature(key):
    check = check_for(key, required=False)
    assert check_signature(check, DIGEST) == "release"
    with pytest.raises(BadSignatureError):
        check_signature(check, hashlib.sha256(b"x").hexdigest())


def test_public_keys_parse_from_base64_or_pem(key):
    text = public_key_text(key)
    pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    assert parse_public_key(f"  {text}\n") == text
    assert parse_public_key(pem) == text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not base64!", "not valid base64"),
        (base64.b64encode(b"x" * 31).decode(), "is 32 bytes .* this one is 31"),
        ("-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----", "not a readable PEM"),
    ],
)
def test_malformed_public_keys_say_why(text, message):
    with pytest.raises(SignatureError, match=message):
        parse_public_key(text)


def test_private_key_files_are_private_and_never_overwritten(tmp_path):
    path = tmp_path / "release.pem"
    key = create_private_key_file(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert public_key_text(load_private_key(path)) == public_key_text(key)
    with pytest.raises(KeyFileExistsError):
        create_private_key_file(path)
    (tmp_path / "junk.pem").write_text("nope")
    with pytest.raises(SignatureError, match="not an unencrypted PEM private key"):
        load_private_key(tmp_path / "junk.pem")


# --- the worker's start-up sequence ------------------------------------------------------------


class NeverServes:
    def prepare(self) -> None:
        raise AssertionError("a refused artifact must not reach prepare()")

    async def serve(self, life: ReplicaLife) -> None:
        raise AssertionError("a refused artifact must not be served")

    async def close(self) -> None:
        return None


def replica(folder: Path, signature: SignatureCheck) -> ReplicaLife:
    digest, files = compute_manifest(folder)
    spec = ReplicaSpec(
        name="signed-model",
        host="127.0.0.1",
        port=9,
        base_url="http://127.0.0.1:9",
        artifact_dir=folder,
        expected_digest=digest,
        expected_files=files,
        signature=signature,
        handle_signals=False,
    )
    return ReplicaLife(spec)


@pytest.fixture
def folder(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"weights")
    return tmp_path


def test_the_sequence_verifies_a_good_signature_before_the_files(key, folder):
    digest, _ = compute_manifest(folder)
    life = replica(folder, check_for(key, digest))
    asyncio.run(life.verify())  # no error: signature and files both good


@pytest.mark.parametrize("case", ["unsigned", "unknown key", "wrong digest"])
def test_the_sequence_refuses_before_anything_starts(key, folder, case):
    digest, _ = compute_manifest(folder)
    check = {
        "unsigned": SignatureCheck(required=True),
        "unknown key": check_for(key, digest, name="someone-else"),
        "wrong digest": check_for(key, hashlib.sha256(b"other").hexdigest()),
    }[case]
    with pytest.raises(ArtifactRefusedError, match=r"^refusing to serve signed-model: "):
        asyncio.run(replica(folder, check).run(NeverServes()))
