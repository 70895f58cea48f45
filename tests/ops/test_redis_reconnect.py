"""Redis clients from runtime.redis_conn survive a Redis restart without repeated fallbacks.

Before the factory, every pooled connection opened before the restart failed once in turn, and
admission fell back to local limits once per dead connection (issue #10: "twice more after
Redis returned"). The control case shows a plain client still does that here.
"""

from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis
from fixtures.private_redis import PrivateRedis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from runtime.admission.limits import Quota
from runtime.admission.redis_limits import RedisLimits
from runtime.redis_conn import async_client, sync_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

POOL = 4  # connections in the pool before the restart


async def fill_pool(client: aioredis.Redis[bytes]) -> None:
    """Open POOL connections (concurrent blocking pops) and return them to the pool."""
    await asyncio.gather(*(client.blpop([f"nothing:{i}"], timeout=0.1) for i in range(POOL)))
    assert len(client.connection_pool._available_connections) >= POOL  # type: ignore[attr-defined]


async def failures_after_restart(client: aioredis.Redis[bytes], server: PrivateRedis) -> int:
    await fill_pool(client)
    server.kill()
    server.start()
    failed = 0
    for _ in range(3):
        results = await asyncio.gather(
            *(client.incr("after-restart") for _ in range(POOL)), return_exceptions=True
        )
        failed += sum(isinstance(r, RedisConnectionError) for r in results)
    return failed


@pytest.mark.asyncio
async def test_plain_client_fails_once_per_stale_connection(server: PrivateRedis) -> None:
    client: aioredis.Redis[bytes] = aioredis.Redis.from_url(server.url, retry=Retry(NoBackoff(), 0))
    try:
        assert await failures_after_restart(client, server) >= 2
    finally:
        await client.aclose()  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_factory_client_reconnects_without_failing(server: PrivateRedis) -> None:
    client = async_client(server.url, name="switchyard-test")
    try:
        assert await failures_after_restart(client, server) == 0
        assert await client.get("after-restart") == str(3 * POOL).encode()
    finally:
        await client.aclose()  # type: ignore[attr-defined]


@pytest.mark.asyncio
async def test_admission_falls_back_at_most_once_across_a_restart(server: PrivateRedis) -> None:
    limits = RedisLimits(server.url, prefix="sytest:ops:limits", retry_s=0.2)
    quota = Quota(rpm=100_000, tpm=10_000_000, concurrency=1000)
    await limits.start()
    try:
        leases = await asyncio.gather(
            *(limits.acquire("acme", quota, tokens=10) for _ in range(POOL))
        )
        assert {lease.source for lease in leases} == {"redis"}
        for lease in leases:
            limits.settle(lease, actual_tokens=10, served=True)
        await limits.flush()

        server.kill()
        server.start()
        fallbacks = 0
        for _ in range(5):
            batch = await asyncio.gather(
                *(limits.acquire("acme", quota, tokens=10) for _ in range(POOL))
            )
            fallbacks += sum(lease.source == "local" for lease in batch)
            for lease in batch:
                limits.settle(lease, actual_tokens=10, served=True)
        assert fallbacks <= 1
        assert not limits.degraded
    finally:
        await limits.stop()


def test_sync_client_reconnects_after_restart(server: PrivateRedis) -> None:
    client = sync_client(server.url, name="switchyard-test")
    try:
        assert client.ping()
        server.kill()
        server.start()
        assert client.ping()  # the dead pooled connection is replaced, not raised
    finally:
        client.close()


def test_negative_retries_are_refused() -> None:
    with pytest.raises(ValueError, match="retries"):
        async_client("redis://127.0.0.1:1/0", name="x", retries=-1)
    with pytest.raises(ValueError, match="retries"):
        sync_client("redis://127.0.0.1:1/0", name="x", retries=-1)
