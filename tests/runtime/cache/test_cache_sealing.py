"""Encryption at rest of the cache (real Redis): what L2 and the idempotency records hold is
sealed per tenant (or the shared scope), reads back, survives a rotation, and an entry that
does not open reads as absent; where the keys come from; zero retention in the cache front."""

from __future__ import annotations

import asyncio
import os
import stat
import uuid
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from prometheus_client import CollectorRegistry

from runtime.cache.entry import CachedUsage, Entry
from runtime.cache.idempotency import Hold, IdempotencyStore
from runtime.cache.metrics import CacheMetrics
from runtime.cache.sealing import Sealer, ensure_for_up, key_file
from runtime.cache.store import ResultStore, StoreConfig
from runtime.contract import cache_entry_key
from runtime.crypto import Keyring, generate_key, is_sealed
from runtime.gateway.cache_front import CacheFront
from runtime.gateway.config import ConfigError, RouterConfig, at_rest_keyring
from runtime.snapshot import CachePolicySnap, ModelSnap, TenantSnap
from runtime.testing.snapshots import limits, version_snap

pytestmark = pytest.mark.unit

K1, K2, K3 = f"k1:{generate_key()}", f"k2:{generate_key()}", f"k3:{generate_key()}"
SECRET = "the launch code is 0000-MARKER"
PROMPT_DIGEST = "d" * 64


def _entry(text: str = SECRET) -> Entry:
    return Entry(kind="chat", id="chatcmpl-1", created=1, model="m", chunks=(text,),
                 finish_reason="stop", usage=CachedUsage(3, 5, 8))  # fmt: skip


NS = f"switchyard:test:seal:{uuid.uuid4().hex[:10]}"  # this module's keys, deleted after each test


def _store(client: aioredis.Redis[bytes], spec: str) -> tuple[ResultStore, CacheMetrics]:
    metrics = CacheMetrics(CollectorRegistry())
    sealer = Sealer(Keyring.from_spec(spec), on_unreadable=metrics.unreadable.inc)
    store = ResultStore(client, namespace=NS, config=StoreConfig(), metrics=metrics,
                        sealer=sealer)  # fmt: skip
    return store, metrics


@pytest.mark.asyncio
async def test_l2_holds_no_plaintext_and_reads_back_across_a_rotation(
    client: aioredis.Redis[bytes],
) -> None:
    ns = NS
    first, _ = _store(client, K1)
    await first.put("acme", "v", "key1", _entry(), ttl_s=60)
    raw = await client.get(cache_entry_key(ns, "acme", "v", "key1"))
    assert raw is not None
    assert is_sealed(raw)
    assert b"MARKER" not in raw
    assert b"launch" not in raw
    assert b"chatcmpl" not in raw

    rotated, _ = _store(client, f"{K2},{K1}")  # a fresh process: empty L1, reads L2
    assert await rotated.get("acme", "v", "key1") == _entry()
    await rotated.put("acme", "v", "key2", _entry("new"), ttl_s=60)
    newer = await client.get(cache_entry_key(ns, "acme", "v", "key2"))
    assert newer is not None
    assert rotated.sealer.keyring.stale(raw)
    assert not rotated.sealer.keyring.stale(newer)

    dropped, metrics = _store(client, K2)  # k1 left the ring: its entries read as misses
    assert await dropped.get("acme", "v", "key1") is None
    assert await dropped.get("acme", "v", "key2") == _entry("new")
    assert metrics.unreadable._value.get() == 1
    assert metrics.lookups.labels("l2", "miss")._value.get() == 1


@pytest.mark.asyncio
async def test_an_entry_moved_to_another_tenant_or_the_shared_scope_does_not_open(
    client: aioredis.Redis[bytes],
) -> None:
    ns = NS
    store, metrics = _store(client, K1)
    await store.put("acme", "v", "k", _entry(), ttl_s=60)
    await store.put("*", "v", "s", _entry("shared"), ttl_s=60)
    acme = await client.get(cache_entry_key(ns, "acme", "v", "k"))
    assert acme is not None
    await client.set(cache_entry_key(ns, "beta", "v", "k"), acme)
    await client.set(cache_entry_key(ns, "*", "v", "k"), acme)
    reader, metrics = _store(client, K1)
    assert await reader.get("beta", "v", "k") is None
    assert await reader.get("*", "v", "k") is None
    assert await reader.get("*", "v", "s") == _entry("shared")
    assert metrics.unreadable._value.get() == 2


@pytest.mark.asyncio
async def test_idempotency_records_are_sealed_replay_and_an_unreadable_one_is_claimed_afresh(
    client: aioredis.Redis[bytes],
) -> None:
    ns = NS
    deadline = asyncio.get_running_loop().time() + 5
    store = IdempotencyStore(client, namespace=ns, sealer=Sealer(Keyring.from_spec(K1)))
    hold = await store.begin("acme", "retry-1", PROMPT_DIGEST, deadline=deadline)
    assert isinstance(hold, Hold)
    await hold.finish(_entry())
    raw = await client.get(hold.name)
    assert raw is not None
    assert is_sealed(raw)
    assert b"MARKER" not in raw
    assert PROMPT_DIGEST.encode() not in raw

    rotated = IdempotencyStore(client, namespace=ns,
                               sealer=Sealer(Keyring.from_spec(f"{K2},{K1}")))  # fmt: skip
    assert await rotated.begin("acme", "retry-1", PROMPT_DIGEST, deadline=deadline) == _entry()

    metrics = CacheMetrics(CollectorRegistry())
    dropped = IdempotencyStore(client, namespace=ns,
                               sealer=Sealer(Keyring.from_spec(K3),
                                             on_unreadable=metrics.unreadable.inc))  # fmt: skip
    again = await dropped.begin("acme", "retry-1", PROMPT_DIGEST, deadline=deadline)
    assert isinstance(again, Hold)  # the unreadable record was forgotten, the key claimed anew
    assert metrics.unreadable._value.get() == 1
    await again.finish(None)
    assert await client.exists(hold.name) == 0


TENANT = TenantSnap(slug="acme", name="Acme", limits=limits())
MODEL = ModelSnap(name="m", task="chat", versions=(1,), cache=CachePolicySnap(enabled=True))
VERSION = version_snap(1, "m", runtime="vllm", digest="sha256:aa")


@pytest.mark.asyncio
async def test_zero_retention_never_looks_up_nor_keeps_a_copy_nor_records_an_answer(
    client: aioredis.Redis[bytes],
) -> None:
    ns = NS
    front = CacheFront(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0"), namespace=ns,
                       metrics=CacheMetrics(CollectorRegistry()),
                       keyring=Keyring.from_spec(K1))  # fmt: skip
    document = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0}
    deadline = asyncio.get_running_loop().time() + 5
    try:
        kept = await front.begin(route="/v1/chat/completions", document=document, model=MODEL,
                                 version=VERSION, tenant=TENANT, cache_control=None,
                                 idempotency=None, deadline=deadline)  # fmt: skip
        assert kept.key
        assert kept.retain
        zero = msgspec_replace(TENANT, zero_retention=True)
        job = await front.begin(route="/v1/chat/completions", document=document, model=MODEL,
                                version=VERSION, tenant=zero, cache_control=None,
                                idempotency=b"once", deadline=deadline)  # fmt: skip
        assert job.key == ""
        assert not job.retain
        assert job.hold is not None  # the running request still guards its key ...
        sink = object()
        assert front.sink_for(job, sink) is sink  # type: ignore[arg-type]  # ... keeps no copy
        await front.finish(job, kind="chat", streaming=False, outcome="ok", usage=None)
        assert await client.exists(job.hold.name) == 0  # ... and no answer is recorded
        assert [k async for k in client.scan_iter(match=f"{ns}:*")] == []
    finally:
        await front.close()


def msgspec_replace(tenant: TenantSnap, **changes: object) -> TenantSnap:
    import msgspec  # noqa: PLC0415

    return msgspec.structs.replace(tenant, **changes)


def test_the_keys_come_from_the_setting_a_file_or_the_var_dir(tmp_path: Path) -> None:
    var = tmp_path / "var"
    made = at_rest_keyring(RouterConfig(snapshot_cache_path=var / "snap.json"))
    assert made.key_ids() == ("k1",)
    assert stat.S_IMODE(key_file(var).stat().st_mode) == 0o600
    again = at_rest_keyring(RouterConfig(snapshot_cache_path=var / "snap.json"))
    probe = made.seal(b"x", "tenant:acme")
    assert again.open(probe, "tenant:acme") == b"x"  # kept, not regenerated

    named = tmp_path / "keys"
    named.write_text(f"{K2}\n{K1}\n")
    from_file = at_rest_keyring(RouterConfig(at_rest_keys_file=str(named)))
    assert from_file.key_ids() == ("k2", "k1")
    from_env = RouterConfig.from_env({"SWITCHYARD_AT_REST_KEYS": f"{K3},{K1}",
                                      "SWITCHYARD_VAR_DIR": str(var)})  # fmt: skip
    assert at_rest_keyring(from_env).primary == "k3"
    assert K3.split(":")[1] not in repr(from_env)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"SWITCHYARD_AT_REST_KEYS": "k1:not-base64!"}, "SWITCHYARD_AT_REST_KEYS"),
        ({"SWITCHYARD_AT_REST_KEYS": "k1:c2hvcnQ="}, "at least 32 bytes"),
        ({"SWITCHYARD_AT_REST_KEYS": "nocolon"}, "expected 'id:<base64 key>'"),
        ({"SWITCHYARD_AT_REST_KEYS_FILE": "/nonexistent/keys"}, "SWITCHYARD_AT_REST_KEYS_FILE"),
    ],
    ids=["not-base64", "short", "no-id", "missing-file"],
)
def test_a_bad_key_setting_is_a_clear_error(env: dict[str, str], named: str) -> None:
    with pytest.raises(ConfigError, match=named):
        at_rest_keyring(RouterConfig.from_env(env))


def test_up_generates_the_keys_file_unless_the_keys_are_set(tmp_path: Path) -> None:
    ensure_for_up(["up"], {"SWITCHYARD_AT_REST_KEYS": K1}, tmp_path / "a")
    assert not key_file(tmp_path / "a").exists()
    ensure_for_up(["migrate"], {}, tmp_path / "b")
    assert not key_file(tmp_path / "b").exists()
    ensure_for_up(["up"], {}, tmp_path / "c")
    assert Keyring.from_spec(key_file(tmp_path / "c").read_text()).key_ids() == ("k1",)
