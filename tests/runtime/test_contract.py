"""runtime.contract: the key layout and API-key format both halves use, and who uses them."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

import config
from apps.tenants.services import api_key_digest as service_digest
from runtime import contract
from runtime.admission.redis_limits import RedisLimits
from runtime.gateway.auth import authenticate
from runtime.gateway.config import RouterConfig
from runtime.gateway.errors import ApiError
from runtime.scheduling.shared import SharedCounters
from runtime.snapshot import ApiKeySnap, Snapshot, TenantLimits, TenantSnap
from runtime.snapshot_store import SnapshotKeys
from runtime.workers.heartbeat import endpoint_heartbeat_key

pytestmark = pytest.mark.unit


def test_a_new_key_has_the_documented_format_and_its_prefix() -> None:
    key = contract.api_key_new()
    prefix = contract.api_key_prefix(key)
    assert prefix is not None
    assert key.startswith(f"sy_{prefix}_")
    assert len(key) == 3 + contract.API_KEY_PREFIX_LENGTH + 1 + contract.API_KEY_SECRET_LENGTH
    assert contract.api_key_prefix(contract.api_key_new("abcd1234")) == "abcd1234"


@pytest.mark.parametrize("prefix", ["ABCD1234", "abc", "abcd12345", "abcd_123"])
def test_a_key_cannot_be_made_with_a_bad_prefix(prefix: str) -> None:
    with pytest.raises(ValueError, match="not a valid API-key prefix"):
        contract.api_key_new(prefix)


@pytest.mark.parametrize(
    "token", ["", "sy_abcd1234", "sk-abcdef", "sy_abcd1234_" + "x" * 39, "sy_ABCD1234_" + "x" * 40]
)
def test_malformed_keys_have_no_prefix(token: str) -> None:
    assert contract.api_key_prefix(token) is None


def test_the_digest_is_sha256_of_the_whole_key_on_both_halves() -> None:
    key = contract.api_key_new()
    expected = hashlib.sha256(key.encode()).hexdigest()
    assert contract.api_key_digest(key) == service_digest(key) == expected
    assert len(contract.api_key_digest("\udcff")) == 64  # any string hashes, none raises


def test_a_key_the_tenants_service_would_store_authenticates_at_the_router() -> None:
    key = contract.api_key_new()
    prefix = contract.api_key_prefix(key)
    assert prefix is not None
    limits = TenantLimits(
        rpm=1, tpm=1, max_concurrency=1, max_context_tokens=1, max_output_tokens=1
    )
    snapshot = Snapshot(
        version=1,
        created_at=0.0,
        tenants={"t": TenantSnap(slug="t", name="T", limits=limits)},
        api_keys={prefix: ApiKeySnap(prefix=prefix, digest=service_digest(key), tenant="t")},
    )
    assert authenticate(snapshot, key, now=0.0).tenant.slug == "t"
    with pytest.raises(ApiError):
        authenticate(snapshot, key[:-1] + ("a" if key[-1] != "a" else "b"), now=0.0)


def test_the_redis_layout() -> None:
    keys = SnapshotKeys()
    assert (keys.seq, keys.latest, keys.channel, keys.version(7)) == (
        "switchyard:snapshot:seq",
        "switchyard:snapshot:latest",
        "switchyard:snapshot:announce",
        "switchyard:snapshot:v:7",
    )
    assert endpoint_heartbeat_key(3) == "switchyard:endpoint:3:heartbeat"
    assert contract.limits_keys("ns:limits", "acme") == (
        "ns:limits:{acme}:rpm",
        "ns:limits:{acme}:tpm",
        "ns:limits:{acme}:conc",
    )
    assert contract.fairness_key("ns:fairness", "gpu") == "ns:fairness:gpu"
    assert contract.credit_key("ns:limits", "acme") == "ns:limits:{acme}:credit"
    assert contract.escrow_key("ns:limits", "acme") == "ns:limits:{acme}:escrow"
    assert contract.usage_stream("ns") == "ns:usage"
    assert RedisLimits("redis://x").keys("acme") == [
        *contract.limits_keys(contract.LIMITS_PREFIX, "acme"),
        contract.credit_key(contract.LIMITS_PREFIX, "acme"),
        contract.escrow_key(contract.LIMITS_PREFIX, "acme"),
    ]
    assert SharedCounters("redis://x").key("gpu") == "switchyard:fairness:gpu"


def test_both_halves_read_the_same_defaults_and_variables() -> None:
    router = RouterConfig.from_env({})
    assert router.snapshot_prefix == contract.SNAPSHOT_PREFIX
    assert router.key_usage_hash == contract.KEY_USAGE_HASH
    assert (router.limits_keys, router.fairness_keys) == (
        contract.LIMITS_PREFIX,
        contract.FAIRNESS_PREFIX,
    )
    moved = RouterConfig.from_env(
        {contract.ENV_SNAPSHOT_PREFIX: "run1:snapshot", contract.ENV_KEY_USAGE_HASH: "run1:h"}
    )
    assert (moved.limits_keys, moved.fairness_keys, moved.key_usage_hash) == (
        "run1:limits",
        "run1:fairness",
        "run1:h",
    )


def test_the_control_plane_settings_read_the_same_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def load() -> ModuleType:
        """A fresh copy of config/settings.py (Django's own settings stay untouched)."""
        spec = importlib.util.spec_from_file_location("settings_copy", settings_file)
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    settings_file = Path(config.__file__).with_name("settings.py")
    monkeypatch.delenv(contract.ENV_SNAPSHOT_PREFIX, raising=False)
    monkeypatch.delenv(contract.ENV_KEY_USAGE_HASH, raising=False)
    plain = load()
    assert plain.SNAPSHOT_REDIS_PREFIX == contract.SNAPSHOT_PREFIX
    assert plain.API_KEY_USAGE_HASH == contract.KEY_USAGE_HASH
    monkeypatch.setenv(contract.ENV_SNAPSHOT_PREFIX, "run1:snapshot")
    monkeypatch.setenv(contract.ENV_KEY_USAGE_HASH, "run1:h")
    moved = load()
    assert (moved.SNAPSHOT_REDIS_PREFIX, moved.API_KEY_USAGE_HASH) == ("run1:snapshot", "run1:h")
