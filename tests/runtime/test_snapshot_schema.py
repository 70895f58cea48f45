"""The snapshot schema: round-trips through JSON, refuses bad documents, digests content."""

from __future__ import annotations

import os
import subprocess
import sys

import msgspec
import pytest

from runtime.snapshot import (
    SCHEMA_VERSION,
    Snapshot,
    content_digest,
    decode,
    encode,
    with_version,
)
from runtime.testing.snapshots import SnapshotBuilder, limits

pytestmark = pytest.mark.unit


KEY = "sy_abcd1234_" + "a" * 40


def full_snapshot(*, rpm: int = 60, version: int = 7, created_at: float = 1.5) -> Snapshot:
    """Every map and struct of the schema, with values that differ from the defaults."""
    world = (
        SnapshotBuilder()
        .add_class("interactive", band=0, ttft_slo_ms=500, deadline_ms=30_000, shed_order=4)
        .add_tenant(
            "acme", weight=2.0, classes=("interactive", "batch"), default_class="interactive",
            tenant_limits=limits(rpm=rpm, tpm=10_000, max_concurrency=4),
        )
        .add_model(
            "tiny", 3, label="v1", artifact_uri="file:///models/tiny", digest="f" * 64,
            runtime="vllm", max_context=2048, tokenizer="tiny",
            default_sampling={"temperature": 0.7, "top_k": 40, "stop": ("\n",), "x": True},
        )
        .add_pool("cpu", cost_per_replica_hour=0.5, max_replicas=2, warm_replicas=1,
                  policies={"fairness": "vtc"})
        .add_endpoint(11, 3, "http://127.0.0.1:9000")
        .add_route("tiny", ((3, 100),))
        .add_price(3, input_per_1k=0.1, output_per_1k=0.2, cache_hit_discount=0.5)
    )  # fmt: skip
    world.add_key("ci", "acme", full_key=KEY)
    return world.snapshot(version=version, created_at=created_at)


def test_round_trip_is_lossless() -> None:
    snapshot = full_snapshot()
    decoded = decode(encode(snapshot))
    assert decoded == snapshot
    assert decoded.versions[3].default_sampling["stop"] == ("\n",)
    assert decoded.endpoints[11].pool == "cpu"  # int-keyed maps survive JSON's string keys
    assert decoded.schema == SCHEMA_VERSION


def test_structures_are_frozen() -> None:
    snapshot = full_snapshot()
    with pytest.raises(AttributeError):
        snapshot.version = 9  # type: ignore[misc]
    with pytest.raises(AttributeError):
        snapshot.tenants["acme"].limits.rpm = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    "raw",
    [
        b"{not json",
        b"[]",
        b'{"created_at": 1.0}',  # no version
        b'{"version": "seven", "created_at": 1.0}',
        b'{"version": 1, "created_at": 1.0, "tenants": {"a": {"slug": "a"}}}',
    ],
    ids=["not-json", "not-object", "missing-field", "wrong-type", "incomplete-tenant"],
)
def test_bad_documents_are_refused(raw: bytes) -> None:
    with pytest.raises((msgspec.ValidationError, msgspec.DecodeError)):
        decode(raw)


def test_bad_shape_raises_validation_error() -> None:
    with pytest.raises(msgspec.ValidationError):
        decode(b'{"version": 1, "created_at": 1.0, "prices": {"not": "a list"}}')


def test_with_version_stamps_a_copy() -> None:
    snapshot = full_snapshot(version=0)
    stamped = with_version(snapshot, 42)
    assert stamped.version == 42
    assert snapshot.version == 0


def test_content_digest_ignores_version_and_time_only() -> None:
    base = content_digest(full_snapshot())
    assert content_digest(full_snapshot(version=99, created_at=123.0)) == base
    assert content_digest(full_snapshot(rpm=61)) != base


def test_runtime_snapshot_modules_import_no_django() -> None:
    code = (
        "import sys, runtime.snapshot, runtime.snapshot_store, runtime.snapshot_loader\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in {'django', 'apps'})\n"
        "assert not bad, bad\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_fields_whose_empty_value_means_something_default_to_it() -> None:
    limits = {"rpm": 1, "tpm": 1, "max_concurrency": 1, "max_context_tokens": 1,
              "max_output_tokens": 1}  # fmt: skip
    document = {
        "version": 1,
        "created_at": 0.0,
        "tenants": {"t": {"slug": "t", "name": "T", "limits": limits}},
        "api_keys": {"abcd1234": {"prefix": "abcd1234", "digest": "0" * 64, "tenant": "t"}},
        "pools": {"p": {"name": "p", "hardware_tier": "cpu", "max_replicas": 1}},
    }
    snap = decode(msgspec.json.encode(document))
    tenant, key, pool = snap.tenants["t"], snap.api_keys["abcd1234"], snap.pools["p"]
    assert (tenant.status, tenant.weight, tenant.classes, tenant.default_class) == (
        "active", 1.0, (), "",
    )  # fmt: skip
    assert (key.scopes, key.expires_at) == (("inference",), None)
    assert (pool.policies, pool.min_replicas, pool.warm_replicas) == ({}, 0, 0)


def test_defaults_are_still_written_so_older_readers_decode_new_documents() -> None:
    raw = msgspec.json.decode(encode(full_snapshot()))
    assert raw["tenants"]["acme"]["status"] == "active"
    assert raw["api_keys"]["abcd1234"]["expires_at"] is None
    assert "policies" in raw["pools"]["cpu"]


@pytest.mark.parametrize("missing", [("tenants", "t", "limits"), ("endpoints", "1", "capacity")])
def test_fields_whose_zero_would_be_a_mistake_stay_required(missing: tuple[str, str, str]) -> None:
    raw = msgspec.json.decode(encode(full_snapshot()))
    table, _, field = missing
    entry = next(iter(raw[table].values()))
    del entry[field]
    with pytest.raises(msgspec.ValidationError, match=field):
        decode(msgspec.json.encode(raw))
