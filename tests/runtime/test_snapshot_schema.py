"""The snapshot schema: round-trips through JSON, refuses bad documents, digests content."""

from __future__ import annotations

import os
import subprocess
import sys

import msgspec
import pytest

from runtime.snapshot import (
    SCHEMA_VERSION,
    ApiKeySnap,
    EndpointSnap,
    ModelSnap,
    PoolSnap,
    PriceSnap,
    RequestClassSnap,
    RouteSnap,
    RouteSplit,
    Snapshot,
    TenantLimits,
    TenantSnap,
    VersionSnap,
    content_digest,
    decode,
    encode,
    with_version,
)

pytestmark = pytest.mark.unit


def full_snapshot(*, rpm: int = 60, version: int = 7, created_at: float = 1.5) -> Snapshot:
    return Snapshot(
        version=version,
        created_at=created_at,
        tenants={
            "acme": TenantSnap(
                slug="acme",
                name="Acme",
                status="active",
                weight=2.0,
                limits=TenantLimits(
                    rpm=rpm,
                    tpm=10_000,
                    max_concurrency=4,
                    max_context_tokens=4096,
                    max_output_tokens=512,
                ),
                classes=("interactive", "batch"),
                default_class="interactive",
            )
        },
        api_keys={
            "abcd1234": ApiKeySnap(
                prefix="abcd1234",
                digest="0" * 64,
                tenant="acme",
                name="ci",
                scopes=("inference",),
                expires_at=None,
            )
        },
        classes={
            "interactive": RequestClassSnap(
                name="interactive",
                priority_band=0,
                ttft_slo_ms=500,
                deadline_ms=30_000,
                max_queue_length=100,
                shed_order=4,
            )
        },
        models={"tiny": ModelSnap(name="tiny", task="chat", versions=(3,))},
        versions={
            3: VersionSnap(
                id=3,
                model="tiny",
                label="v1",
                artifact_uri="file:///models/tiny",
                digest="f" * 64,
                runtime="vllm",
                max_context=2048,
                tokenizer="tiny",
                default_sampling={"temperature": 0.7, "top_k": 40, "stop": ("\n",), "x": True},
                memory_gb=1.0,
                tensor_parallel_size=1,
            )
        },
        pools={
            "cpu": PoolSnap(
                name="cpu",
                hardware_tier="cpu",
                cost_per_replica_hour=0.5,
                min_replicas=0,
                max_replicas=2,
                warm_replicas=1,
                policies={"fairness": "vtc"},
            )
        },
        endpoints={
            11: EndpointSnap(
                id=11,
                pool="cpu",
                version=3,
                base_url="http://127.0.0.1:9000",
                state="ready",
                capacity=8,
            )
        },
        routes={
            "tiny": RouteSnap(
                model="tiny", splits=(RouteSplit(version=3, weight=100),), sticky_key="tenant"
            )
        },
        prices=(
            PriceSnap(
                version=3,
                hardware_tier="cpu",
                input_per_1k=0.1,
                output_per_1k=0.2,
                cache_hit_discount=0.5,
            ),
        ),
    )


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
