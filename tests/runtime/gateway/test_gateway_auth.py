"""API-key authentication against a hand-built snapshot."""

from __future__ import annotations

import hashlib
import time

import pytest
from gateway_fleet import World

from runtime.gateway import auth
from runtime.gateway.auth import authenticate, bearer_token
from runtime.gateway.errors import ApiError

pytestmark = pytest.mark.unit


@pytest.fixture
def world() -> World:
    world = World()
    world.add_tenant("acme")
    world.add_tenant("frozen", status="suspended")
    world.add_key("good", "acme")
    world.add_key("expired", "acme", expires_at=time.time() - 1)
    world.add_key("future", "acme", expires_at=time.time() + 3600)
    world.add_key("frozen", "frozen")
    world.add_key("readonly", "acme", scopes=("read",))
    world.add_key("orphan", "deleted-tenant")
    return world


def test_the_dummy_digest_is_what_it_says() -> None:
    assert hashlib.sha256(b"switchyard: no such key").hexdigest() == auth._DUMMY_DIGEST


def test_a_good_key_names_its_tenant(world: World) -> None:
    snapshot = world.snapshot()
    for name in ("good", "future"):
        principal = authenticate(snapshot, world.secrets[name], now=time.time())
        assert principal.tenant.slug == "acme"
        assert principal.key.prefix == world.secrets[name].split("_")[1]


@pytest.mark.parametrize(
    ("token", "code"),
    [
        ("expired", "expired_api_key"),
        ("frozen", "tenant_suspended"),
        ("readonly", "insufficient_scope"),
        ("orphan", "invalid_api_key"),
        ("tampered", "invalid_api_key"),
        ("sy_abcdefgh_" + "x" * 40, "invalid_api_key"),
        ("sy_short_x", "invalid_api_key"),
        ("sk-1234", "invalid_api_key"),
        ("sy_ABCDEFGH_" + "x" * 40, "invalid_api_key"),
    ],
)
def test_refusals(world: World, token: str, code: str) -> None:
    if token in world.secrets:
        token = world.secrets[token]
    elif token == "tampered":
        good = world.secrets["good"]
        token = good[:-1] + ("a" if good[-1] != "a" else "b")
    with pytest.raises(ApiError) as info:
        authenticate(world.snapshot(), token, now=time.time())
    assert info.value.code == code


@pytest.mark.parametrize(
    ("header", "token"),
    [(b"Bearer abc", "abc"), (b"bearer   abc  ", "abc"), (b"BEARER x", "x")],
)
def test_bearer_token(header: bytes, token: str) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize("header", [None, b"", b"Bearer", b"Bearer   ", b"Token abc", b"abc"])
def test_bearer_token_missing(header: bytes | None) -> None:
    with pytest.raises(ApiError) as info:
        bearer_token(header)
    assert (info.value.status, info.value.code) == (401, "missing_api_key")
