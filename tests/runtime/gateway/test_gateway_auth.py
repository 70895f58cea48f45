"""API-key authentication against a hand-built snapshot."""

from __future__ import annotations

import hashlib
import time

import pytest
from gateway_fleet import World

from runtime.gateway import auth
from runtime.gateway.auth import PrincipalCache, authenticate, bearer_token
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


# -- the principal cache: the same answers as authenticate, a hit skips the digest -------------


def _header(token: str) -> bytes:
    return b"Bearer " + token.encode()


def test_the_cache_answers_a_known_header_with_the_principal_it_kept(world: World) -> None:
    cache = PrincipalCache()
    snapshot = world.snapshot()
    first = cache.principal(snapshot, _header(world.secrets["good"]), now=time.time())
    assert first == authenticate(snapshot, world.secrets["good"], now=time.time())
    # kept: the same object (authenticate builds a new one each time)
    assert cache.principal(snapshot, _header(world.secrets["good"]), now=time.time()) is first


@pytest.mark.parametrize(
    ("token", "code"),
    [("expired", "expired_api_key"), ("frozen", "tenant_suspended"),
     ("readonly", "insufficient_scope"), ("orphan", "invalid_api_key"),
     ("sy_abcdefgh_" + "x" * 40, "invalid_api_key")],
)  # fmt: skip
def test_the_cache_keeps_no_refusal(world: World, token: str, code: str) -> None:
    cache = PrincipalCache()
    snapshot = world.snapshot()
    header = _header(world.secrets.get(token, token))
    for _ in range(2):
        with pytest.raises(ApiError) as info:
            cache.principal(snapshot, header, now=time.time())
        assert info.value.code == code


@pytest.mark.parametrize("header", [None, b"", b"Token abc"])
def test_the_cache_refuses_a_missing_key(world: World, header: bytes | None) -> None:
    with pytest.raises(ApiError) as info:
        PrincipalCache().principal(world.snapshot(), header, now=time.time())
    assert info.value.code == "missing_api_key"


def test_a_kept_key_expires_on_time(world: World) -> None:
    cache = PrincipalCache()
    snapshot = world.snapshot()
    header = _header(world.secrets["future"])
    expires_at = snapshot.api_keys[world.secrets["future"].split("_")[1]].expires_at
    assert expires_at is not None
    cache.principal(snapshot, header, now=expires_at - 1)
    with pytest.raises(ApiError) as info:
        cache.principal(snapshot, header, now=expires_at)
    assert info.value.code == "expired_api_key"


def test_a_new_snapshot_starts_the_cache_afresh(world: World) -> None:
    cache = PrincipalCache()
    header = _header(world.secrets["good"])
    cache.principal(world.snapshot(), header, now=time.time())
    world.add_tenant("acme", status="suspended")  # the control plane suspends the tenant
    with pytest.raises(ApiError) as info:
        cache.principal(world.snapshot(version=1), header, now=time.time())
    assert info.value.code == "tenant_suspended"


def test_a_full_cache_starts_again_and_stays_right(world: World) -> None:
    cache = PrincipalCache(limit=1)
    snapshot = world.snapshot()
    for name in ("good", "future", "good"):
        principal = cache.principal(snapshot, _header(world.secrets[name]), now=time.time())
        assert principal.key.prefix == world.secrets[name].split("_")[1]
