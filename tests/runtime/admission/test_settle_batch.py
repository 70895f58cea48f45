"""One settle script call per flush (issue #27): every settlement of the batch is applied
exactly once, as if it were sent alone; a large batch goes in a few calls; the script answers
each settlement's charge (-1: a replay). A private redis-server, so its command counts are the
router's alone."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis
from fixtures.private_redis import PrivateRedis, running

from runtime.admission import settle_calls
from runtime.admission.limits import Quota
from runtime.admission.redis_limits import RedisLimits, Settlement
from runtime.admission.scripts import SETTLE_LUA
from runtime.admission.settle_calls import DONE_TTL_S
from runtime.contract import credit_key, done_key, escrow_key, limits_keys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

PREFIX = "sytest:settle-batch"
STREAM = f"{PREFIX}:usage"
QUOTA = Quota(rpm=100_000, tpm=100_000_000, concurrency=100_000)
BALANCE = 1_000


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    with running(tmp_path / "redis") as server:
        yield server


@pytest.fixture
def client(server: PrivateRedis) -> Iterator[redis.Redis[bytes]]:
    client: redis.Redis[bytes] = redis.Redis.from_url(server.url)
    for tenant in ("acme", "beta"):
        client.hset(credit_key(PREFIX, tenant), "balance", BALANCE)
    client.script_load(SETTLE_LUA)  # no NOSCRIPT reply in the calls counted
    yield client
    client.close()


@pytest_asyncio.fixture
async def limits(server: PrivateRedis) -> AsyncIterator[RedisLimits]:
    """Started, no allowance (every lease is Redis's), a linger no test waits out."""
    limits = RedisLimits(server.url, prefix=PREFIX, usage_stream=STREAM, allowance_ttl_s=None,
                         settle_linger_s=30.0)  # fmt: skip
    await limits.start()
    yield limits
    await limits.stop()


def evalsha_calls(client: redis.Redis[bytes]) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def balance(client: redis.Redis[bytes], tenant: str) -> int:
    return int(client.hget(credit_key(PREFIX, tenant), "balance") or 0)


def charged_events(client: redis.Redis[bytes]) -> dict[str, int]:
    """Usage event id -> µc charged, failing on an event appended twice."""
    events: dict[str, int] = {}
    for _id, fields in client.xrange(STREAM):
        name = json.loads(fields[b"event"])["id"]
        assert name not in events, f"{name} appended twice"
        events[name] = int(fields[b"charged"])
    return events


@pytest.mark.asyncio
async def test_the_settlements_of_one_flush_are_one_call_each_applied_once(
    limits: RedisLimits, client: redis.Redis[bytes]
) -> None:
    tenants = ("acme", "acme", "beta")
    leases = [await limits.acquire(tenant, QUOTA, tokens=10) for tenant in tenants]
    client.config_resetstat()
    costs = (100, 250, 40)
    for n, (lease, cost) in enumerate(zip(leases, costs, strict=True)):
        limits.settle(lease, actual_tokens=4, served=True, cost_uc=cost,
                      event=json.dumps({"id": f"e{n}"}).encode())  # fmt: skip
    assert await limits.flush() == 3  # queued with no await between: one batch
    assert evalsha_calls(client) == 1
    assert balance(client, "acme") == BALANCE - 350
    assert balance(client, "beta") == BALANCE - 40
    assert charged_events(client) == {"e0": 100, "e1": 250, "e2": 40}
    for tenant in ("acme", "beta"):
        assert client.zcard(limits_keys(PREFIX, tenant)[2]) == 0  # every slot is free
    for lease in leases:
        assert client.exists(done_key(PREFIX, lease.tenant, lease.id))


@pytest.mark.asyncio
async def test_a_batch_larger_than_one_call_goes_in_a_few_each_applied_once(
    limits: RedisLimits, client: redis.Redis[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(settle_calls, "SETTLES_PER_CALL", 3)
    leases = [await limits.acquire("acme", QUOTA, tokens=10) for _ in range(7)]
    client.config_resetstat()
    for n, lease in enumerate(leases):
        limits.settle(lease, actual_tokens=4, served=True, cost_uc=10,
                      event=json.dumps({"id": f"e{n}"}).encode())  # fmt: skip
    assert await limits.flush() == 7
    assert evalsha_calls(client) == 3  # 3 + 3 + 1
    assert balance(client, "acme") == BALANCE - 70
    assert charged_events(client) == {f"e{n}": 10 for n in range(7)}


@pytest.mark.asyncio
async def test_a_batch_across_midnight_charges_each_settlement_to_its_own_day(
    limits: RedisLimits, client: redis.Redis[bytes]
) -> None:
    """The budget period fields are per call: a new call where they change (a replay of an
    older spool, a batch across midnight UTC)."""
    client.config_resetstat()
    days = [("d:1", "m:1", 100), ("d:1", "m:1", 20), ("d:2", "m:1", 3), ("d:3", "m:2", 7)]
    for n, (day, month, cost) in enumerate(days):
        limits._queue(Settlement("acme", f"l{n}", 0, False, cost, day, month, ""))
    assert await limits.flush() == 4
    assert evalsha_calls(client) == 3
    credit = client.hgetall(credit_key(PREFIX, "acme"))
    assert {k: int(v) for k, v in credit.items() if k != b"balance"} == {
        b"d:1": 120, b"d:2": 3, b"d:3": 7, b"m:1": 123, b"m:2": 7}  # fmt: skip
    assert balance(client, "acme") == BALANCE - 130


def settle_call(lease: str, cost: int) -> tuple[list[str], list[object]]:
    """One settlement of acme's, alone (the per-settlement layout)."""
    keys = [*limits_keys(PREFIX, "acme"), credit_key(PREFIX, "acme"),
            escrow_key(PREFIX, "acme"), STREAM, done_key(PREFIX, "acme", lease)]  # fmt: skip
    return keys, [lease, 0, "0", cost, "d", "m", json.dumps({"id": lease}), DONE_TTL_S]


def test_the_script_answers_each_settlements_charge_and_skips_a_replay(
    client: redis.Redis[bytes],
) -> None:
    script = client.register_script(SETTLE_LUA)
    keys, args = settle_call("l1", 300)
    assert script(keys=keys, args=args) == [300]
    # l1 again (a spool replay), l2 (more than what is left: all of it), l3 of beta's
    beta = [*limits_keys(PREFIX, "beta"), credit_key(PREFIX, "beta"), escrow_key(PREFIX, "beta")]
    keys = [*keys, done_key(PREFIX, "acme", "l2"), done_key(PREFIX, "beta", "l3"), *beta]
    args = [*args, 1, "l2", 0, "0", 900, json.dumps({"id": "l2"}),
            2, "l3", 0, "0", 40, json.dumps({"id": "l3"})]  # fmt: skip
    assert script(keys=keys, args=args) == [-1, BALANCE - 300, 40]
    assert balance(client, "acme") == 0
    assert balance(client, "beta") == BALANCE - 40
    assert charged_events(client) == {"l1": 300, "l2": BALANCE - 300, "l3": 40}


@pytest.mark.parametrize(
    "mangle",
    [
        lambda keys, args: (keys, args[:-1]),  # an argument short
        lambda keys, args: (keys[:-1], args),  # a key short
        lambda keys, args: (keys, [*args[:8], 3, *args[9:]]),  # a tenant block not given
    ],
    ids=["argument-short", "key-short", "no-such-block"],
)
def test_a_call_whose_arguments_do_not_match_its_keys_is_refused_whole(
    client: redis.Redis[bytes], mangle: Any
) -> None:
    script = client.register_script(SETTLE_LUA)
    keys, args = settle_call("l1", 300)
    keys = [*keys, done_key(PREFIX, "acme", "l2")]
    args = [*args, 1, "l2", 0, "0", 200, json.dumps({"id": "l2"})]
    with pytest.raises(redis.ResponseError, match="malformed"):
        script(*mangle(keys, args))
    assert balance(client, "acme") == BALANCE  # nothing applied, not even the first


@pytest.mark.asyncio
async def test_an_applied_flush_leaves_an_empty_spool_and_a_failed_one_keeps_it(
    server: PrivateRedis, client: redis.Redis[bytes], tmp_path: Path
) -> None:
    spool = tmp_path / "spool"
    limits = RedisLimits(server.url, prefix=PREFIX, usage_stream=STREAM, allowance_ttl_s=None,
                         settle_linger_s=30.0, spool_dir=spool, timeout_s=0.2,
                         retry_s=0.0)  # fmt: skip
    await limits.start()
    try:
        current = spool / "0" / "current.jsonl"
        limits._queue(Settlement("acme", "l1", 0, False, 10, "d", "m", '{"id":"l1"}'))
        assert current.stat().st_size > 0
        assert await limits.flush() == 1
        assert current.stat().st_size == 0  # applied: truncated, no segment
        assert not list(spool.rglob("segment-*.jsonl"))
        server.kill()
        limits._queue(Settlement("acme", "l2", 0, False, 20, "d", "m", '{"id":"l2"}'))
        assert await limits.flush() == 0  # Redis is gone: the line stays on disk
        assert b'"l2"' in current.read_bytes()
        server.start()
        assert await limits.flush() == 1
        assert current.stat().st_size == 0
    finally:
        await limits.stop()
    assert charged_events(client) == {"l1": 10, "l2": 20}  # each once (append-only Redis)


@pytest.mark.asyncio
async def test_overlapping_writes_leave_the_spool_to_the_next_write_alone(
    server: PrivateRedis, client: redis.Redis[bytes], tmp_path: Path
) -> None:
    """Two writes in flight at once (a fallback refusal's write beside the task's): neither
    cleans the spool up (either one's batch may fail and go back to memory only); the next
    write alone does."""
    spool = tmp_path / "spool"
    limits = RedisLimits(server.url, prefix=PREFIX, usage_stream=STREAM, allowance_ttl_s=None,
                         settle_linger_s=30.0, spool_dir=spool)  # fmt: skip
    await limits.start()
    try:
        current = spool / "0" / "current.jsonl"
        limits._queue(Settlement("acme", "l1", 0, False, 1, "d", "m", '{"id":"l1"}'))
        first = asyncio.create_task(limits._write())
        await asyncio.sleep(0)  # the first write is waiting for Redis
        assert limits._writes_in_flight == 1
        limits._queue(Settlement("acme", "l2", 0, False, 2, "d", "m", '{"id":"l2"}'))
        assert await limits._write() == 1
        assert await first == 1
        assert b'"l1"' in current.read_bytes()  # applied, but not cleaned up
        assert b'"l2"' in current.read_bytes()
        limits._queue(Settlement("acme", "l3", 0, False, 3, "d", "m", '{"id":"l3"}'))
        assert await limits.flush() == 1  # alone: all three are applied
        assert current.stat().st_size == 0
        assert not list(spool.rglob("segment-*.jsonl"))
    finally:
        await limits.stop()
    assert charged_events(client) == {"l1": 1, "l2": 2, "l3": 3}
