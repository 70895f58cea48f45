"""Artifact signatures in the registry's REST API and commands: trusted keys (validated where
written: a malformed key is a field error), a version's signature (checked against the key),
``make_signing_key`` / ``sign_artifact`` and the demo key."""

from __future__ import annotations

import stat
from io import StringIO
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from django.core.management import CommandError, call_command
from django.urls import reverse
from rest_framework.test import APIClient

from apps.common.models import AuditEvent
from apps.models.demo_signing import DEMO_KEY_PATH, demo_sign
from apps.models.models import ModelVersion, TrustedKey
from runtime.signing import (
    generate_private_key,
    public_key_text,
    sign_digest,
    verify_signature,
)
from tests.api.conftest import World

pytestmark = pytest.mark.db

OPS = "/api/v1/ops"


def _patch(client: APIClient, url: str, data: dict[str, Any]) -> Any:
    etag = client.get(url)["ETag"]
    return client.patch(url, data, format="json", HTTP_IF_MATCH=etag)


def _add_key(client: APIClient, name: str, public_key: str) -> Any:
    return client.post(
        f"{OPS}/trusted-keys/", {"name": name, "public_key": public_key}, format="json"
    )


def test_trusted_keys_create_from_base64_or_pem_list_and_deactivate(
    world: World, staff_client: APIClient
) -> None:
    key, _ = generate_private_key()
    other, _ = generate_private_key()
    created = _add_key(staff_client, "release", public_key_text(key))
    assert created.status_code == 201, created.content
    assert created.json()["public_key"] == public_key_text(key)
    assert created.json()["active"] is True
    pem = (
        other.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    from_pem = _add_key(staff_client, "ci", pem)
    assert from_pem.status_code == 201, from_pem.content
    assert from_pem.json()["public_key"] == public_key_text(other)  # stored as base64
    listed = staff_client.get(f"{OPS}/trusted-keys/").json()["results"]
    assert [k["name"] for k in listed] == ["ci", "release"]
    url = f"{OPS}/trusted-keys/{created.json()['id']}/"
    off = _patch(staff_client, url, {"active": False})
    assert off.status_code == 200, off.content
    assert off.json()["active"] is False
    actions = AuditEvent.objects.filter(target_type="registry.trustedkey").values_list(
        "action", flat=True
    )
    assert sorted(actions) == ["trusted_key.create", "trusted_key.create", "trusted_key.update"]


@pytest.mark.parametrize(
    ("body", "fields"),
    [
        (
            {"name": "release", "public_key": "not base64!"},
            {"public_key": ["Not an Ed25519 public key: the public key is not valid base64."]},
        ),
        (
            {"name": "release", "public_key": "c2hvcnQ="},
            {
                "public_key": [
                    "Not an Ed25519 public key: an Ed25519 public key is 32 bytes "
                    "(44 base64 characters), this one is 5."
                ]
            },
        ),
        (
            {
                "name": "release",
                "public_key": "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----",
            },
            {"public_key": ["Not an Ed25519 public key: not a readable PEM public key."]},
        ),
        (
            {"name": "Release Key", "public_key": "VALID"},
            {
                "name": [
                    "Key name must be 1-63 characters of lowercase letters, digits or '-', "
                    "starting and ending with a letter or digit."
                ]
            },
        ),
    ],
)
def test_malformed_trusted_keys_are_field_errors(
    world: World, staff_client: APIClient, body: dict[str, str], fields: dict[str, list[str]]
) -> None:
    if body["public_key"] == "VALID":
        body = {**body, "public_key": public_key_text(generate_private_key()[0])}
    refused = staff_client.post(f"{OPS}/trusted-keys/", body, format="json")
    assert refused.status_code == 400, refused.content
    assert refused.json()["error"]["fields"] == fields
    assert not TrustedKey.objects.exists()


def test_a_key_or_name_is_trusted_once(world: World, staff_client: APIClient) -> None:
    key = public_key_text(generate_private_key()[0])
    assert _add_key(staff_client, "release", key).status_code == 201
    again = _add_key(staff_client, "release-2", key)
    assert again.status_code == 400
    assert again.json()["error"]["fields"] == {
        "public_key": ["This key is already trusted as release."]
    }
    same_name = _add_key(staff_client, "release", public_key_text(generate_private_key()[0]))
    assert same_name.json()["error"]["fields"] == {
        "name": ["A trusted key named 'release' already exists."]
    }


def test_a_version_signature_is_checked_where_it_is_recorded(
    world: World, staff_client: APIClient
) -> None:
    key, _ = generate_private_key()
    _add_key(staff_client, "release", public_key_text(key))
    version = world.version
    url = f"{OPS}/versions/{version.pk}/signature/"
    wrong = staff_client.post(
        url, {"key": "release", "signature": sign_digest(key, "ab" * 32)}, format="json"
    )
    assert wrong.status_code == 400
    assert wrong.json()["error"]["fields"] == {
        "signature": [
            f"the signature does not verify against digest {version.digest} with that key."
        ]
    }
    unknown = staff_client.post(
        url, {"key": "nobody", "signature": sign_digest(key, version.digest)}, format="json"
    )
    assert unknown.status_code == 400
    assert list(unknown.json()["error"]["fields"]) == ["key"]
    good = staff_client.post(
        url, {"key": "release", "signature": sign_digest(key, version.digest)}, format="json"
    )
    assert good.status_code == 200, good.content
    assert good.json()["signing_key"] == "release"
    assert (
        staff_client.get(f"{OPS}/versions/{version.pk}/").json()["signature"]
        == (good.json()["signature"])
    )
    assert AuditEvent.objects.filter(action="model_version.sign", target_id=str(version.pk))


def test_an_inactive_key_cannot_sign(world: World, staff_client: APIClient) -> None:
    key, _ = generate_private_key()
    key_id = _add_key(staff_client, "old", public_key_text(key)).json()["id"]
    _patch(staff_client, f"{OPS}/trusted-keys/{key_id}/", {"active": False})
    refused = staff_client.post(
        f"{OPS}/versions/{world.version.pk}/signature/",
        {"key": "old", "signature": sign_digest(key, world.version.digest)},
        format="json",
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["fields"] == {
        "key": ["Key old is inactive; workers would refuse its signature."]
    }


# --- commands ---------------------------------------------------------------------------------


def test_make_signing_key_then_sign_artifact(world: World, tmp_path: Any) -> None:
    pem = tmp_path / "release.pem"
    out = StringIO()
    call_command("make_signing_key", "release", "--out", str(pem), stdout=out)
    assert stat.S_IMODE(pem.stat().st_mode) == 0o600
    trusted = TrustedKey.objects.get(name="release")
    assert f"trusted key release registered: {trusted.public_key}" in out.getvalue()
    version = world.version
    call_command("sign_artifact", version.model.name, version.label, "--key", str(pem), stdout=out)
    version.refresh_from_db()
    assert version.signing_key == trusted
    verify_signature(trusted.public_key, version.digest, version.signature)  # raises if bad
    with pytest.raises(CommandError, match="already exists; not overwriting"):
        call_command("make_signing_key", "other", "--out", str(pem), stdout=out)


def test_sign_artifact_refusals(world: World, tmp_path: Any) -> None:
    pem = tmp_path / "stranger.pem"
    call_command(
        "make_signing_key", "stranger", "--out", str(pem), "--no-register", stdout=StringIO()
    )
    assert not TrustedKey.objects.exists()
    version = world.version
    with pytest.raises(CommandError, match="key: The registry does not trust this key"):
        call_command("sign_artifact", version.model.name, version.label, "--key", str(pem))
    with pytest.raises(CommandError, match="no version 'v9'"):
        call_command("sign_artifact", version.model.name, "v9", "--key", str(pem))
    with pytest.raises(CommandError, match="cannot read the private key"):
        call_command("sign_artifact", version.model.name, version.label, "--key", "/nonexistent")
    with pytest.raises(CommandError, match="name: Key name must be"):
        call_command("make_signing_key", "Bad Name", "--out", str(tmp_path / "x.pem"))
    assert not (tmp_path / "x.pem").exists()
    assert ModelVersion.objects.get(pk=version.pk).signature == ""


def test_the_demo_key_is_made_once_and_signs_once(world: World, tmp_path: Any) -> None:
    version = world.version
    assert demo_sign(version=version, var_dir=tmp_path) is True
    key_file = tmp_path / DEMO_KEY_PATH
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    trusted = TrustedKey.objects.get()
    assert trusted.name.startswith("demo-")
    assert demo_sign(version=version, var_dir=tmp_path) is False  # signed already
    assert TrustedKey.objects.count() == 1
    verify_signature(trusted.public_key, version.digest, version.signature)


# --- admin ------------------------------------------------------------------------------------


def test_the_admin_adds_keys_through_the_service_and_shows_a_malformed_key(
    admin_client: Any, db: Any
) -> None:
    add = reverse("admin:registry_trustedkey_add")
    assert admin_client.get(add).status_code == 200
    bad = admin_client.post(add, {"name": "release", "public_key": "c2hvcnQ=", "active": "on"})
    assert bad.status_code == 200  # the form again, with the service's message
    assert "an Ed25519 public key is 32 bytes" in bad.content.decode()
    assert not TrustedKey.objects.exists()

    key, _ = generate_private_key()
    pem = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    good = admin_client.post(add, {"name": "release", "public_key": pem, "active": "on"})
    assert good.status_code == 302
    trusted = TrustedKey.objects.get()
    assert trusted.public_key == public_key_text(key)

    change = reverse("admin:registry_trustedkey_change", args=[trusted.pk])
    assert admin_client.post(change, {"active": ""}).status_code == 302  # unticked
    trusted.refresh_from_db()
    assert trusted.active is False
    assert AuditEvent.objects.filter(action="trusted_key.update").count() == 1
