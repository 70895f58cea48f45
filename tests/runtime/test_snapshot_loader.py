"""SnapshotLoader against a real Redis: load, follow, disk fallback, bad documents, reconnects."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import redis
from django.conf import settings
from fixtures.net import free_port
from fixtures.redis_keys import RedisClient
from fixtures.redis_server import private_redis
from fixtures.wait import async_eventually

from runtime import snapshot_store
from runtime.snapshot import SCHEMA_VERSION, Snapshot, decode, encode
from runtime.snapshot_loader import SnapshotLoader, SnapshotUnavailableError
from runtime.snapshot_store import SnapshotKeys

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def cache_path(tmp_path: Path) -> Path:
    return tmp_path / "router" / "snapshot.json"


@pytest.fixture
def closed_port() -> int:
    """A local TCP port nothing listens on (connections are refused at once)."""
    return free_port()


@pytest_asyncio.fixture
async def loaders() -> AsyncIterator[list[SnapshotLoader]]:
    """Loaders a test creates; all stopped at the end, whatever happens."""
    created: list[SnapshotLoader] = []
    yield created
    for loader in created:
        await loader.stop()


def make_loader(
    loaders: list[SnapshotLoader], url: str, cache_path: Path, key_prefix: str, **kwargs: Any
) -> SnapshotLoader:
    loader = SnapshotLoader(url, cache_path, key_prefix, **kwargs)
    loaders.append(loader)
    return loader


def publish(redis_client: RedisClient, key_prefix: str) -> int:
    snapshot = Snapshot(version=0, created_at=time.time())
    return snapshot_store.publish(redis_client, snapshot, prefix=key_prefix).version


async def apublish(redis_client: RedisClient, key_prefix: str) -> int:
    return await asyncio.to_thread(publish, redis_client, key_prefix)


@pytest.mark.asyncio
async def test_loads_latest_follows_announcements_and_writes_disk_copy(
    redis_client: RedisClient, key_prefix: str, cache_path: Path, loaders: list[SnapshotLoader]
) -> None:
    first = publish(redis_client, key_prefix)
    swaps: list[int] = []
    on_swap = [lambda s: swaps.append(s.version)]
    loader = make_loader(loaders, settings.REDIS_URL, cache_path, key_prefix, on_swap=on_swap)
    await loader.start()
    assert loader.source == "redis"
    assert loader.current.version == first

    second = await apublish(redis_client, key_prefix)
    started = time.monotonic()
    snapshot = await loader.wait_for_version(second, timeout_s=1.0)
    assert time.monotonic() - started < 1.0
    assert snapshot.version == second
    assert loader.version == second
    assert swaps == [first, second]
    await async_eventually(
        lambda: cache_path.exists() and decode(cache_path.read_bytes()).version == second,
        timeout=2.0,
    )
    assert not [p for p in cache_path.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.asyncio
async def test_starts_from_disk_copy_when_redis_is_unreachable(
    redis_client: RedisClient,
    key_prefix: str,
    cache_path: Path,
    closed_port: int,
    loaders: list[SnapshotLoader],
) -> None:
    publish(redis_client, key_prefix)
    version = publish(redis_client, key_prefix)
    earlier = make_loader(loaders, settings.REDIS_URL, cache_path, key_prefix)
    await earlier.start()
    await async_eventually(cache_path.exists, timeout=2.0)
    await earlier.stop()

    offline = make_loader(loaders, f"redis://127.0.0.1:{closed_port}/0", cache_path, key_prefix)
    started = time.monotonic()
    await offline.start()
    assert time.monotonic() - started < 2.0
    assert offline.source == "disk"
    assert offline.current.version == version


@pytest.mark.asyncio
async def test_no_redis_and_no_disk_copy_is_a_clear_error(
    key_prefix: str, cache_path: Path, closed_port: int, loaders: list[SnapshotLoader]
) -> None:
    loader = make_loader(loaders, f"redis://127.0.0.1:{closed_port}/0", cache_path, key_prefix)
    with pytest.raises(SnapshotUnavailableError, match="Redis unreachable") as info:
        await loader.start()
    assert "no disk copy of the snapshot at" in str(info.value)
    with pytest.raises(SnapshotUnavailableError, match="no snapshot loaded"):
        _ = loader.current


@pytest.mark.asyncio
async def test_nothing_published_and_no_disk_copy_is_a_clear_error(
    key_prefix: str, cache_path: Path, loaders: list[SnapshotLoader]
) -> None:
    loader = make_loader(loaders, settings.REDIS_URL, cache_path, key_prefix)
    with pytest.raises(SnapshotUnavailableError, match=r"no snapshot published at .*:latest"):
        await loader.start()


@pytest.mark.asyncio
async def test_corrupt_disk_copy_is_a_clear_error(
    key_prefix: str, cache_path: Path, closed_port: int, loaders: list[SnapshotLoader]
) -> None:
    cache_path.parent.mkdir(parents=True)
    cache_path.write_bytes(b'{"version": "x"}')  # noqa: ASYNC240 - test setup
    loader = make_loader(loaders, f"redis://127.0.0.1:{closed_port}/0", cache_path, key_prefix)
    with pytest.raises(SnapshotUnavailableError, match="is unusable"):
        await loader.start()


@pytest.mark.asyncio
async def test_bad_documents_announced_are_ignored(
    redis_client: RedisClient, key_prefix: str, cache_path: Path, loaders: list[SnapshotLoader]
) -> None:
    keys = SnapshotKeys(key_prefix)
    good = publish(redis_client, key_prefix)
    swaps: list[int] = []
    on_swap = [lambda s: swaps.append(s.version)]
    loader = make_loader(loaders, settings.REDIS_URL, cache_path, key_prefix, on_swap=on_swap)
    await loader.start()
    await async_eventually(cache_path.exists, timeout=2.0)

    def bad(body: bytes | None) -> None:
        version = int(redis_client.incr(keys.seq))
        redis_client.set(
            keys.version(version),
            body if body is not None else encode(Snapshot(version=version + 1000, created_at=0.0)),
        )
        redis_client.publish(keys.channel, str(version))

    bad(b"{not json")
    bad(b'{"version": 1, "created_at": 1.0, "tenants": {"t": {"slug": "t"}}}')
    bad(None)  # valid JSON that claims another version
    version = int(redis_client.incr(keys.seq))
    redis_client.set(
        keys.version(version),
        encode(Snapshot(version=version, created_at=0.0, schema=SCHEMA_VERSION + 1)),
    )
    redis_client.publish(keys.channel, str(version))
    redis_client.publish(keys.channel, "not-a-number")
    redis_client.publish(keys.channel, "999999")  # announced but never stored
    assert loader.current.version == good
    # Announcements are handled in order: once the next good one is served, every bad one
    # before it was seen and refused (no swap, no disk write in between).
    newest = await apublish(redis_client, key_prefix)
    await loader.wait_for_version(newest, timeout_s=1.0)
    assert swaps == [good, newest]
    await async_eventually(
        lambda: decode(cache_path.read_bytes()).version == newest, timeout=2.0, what="disk copy"
    )


@pytest.mark.asyncio
async def test_reconnects_after_connection_killed_and_catches_up(
    redis_client: RedisClient, key_prefix: str, cache_path: Path, loaders: list[SnapshotLoader]
) -> None:
    keys = SnapshotKeys(key_prefix)
    name = f"sytest-loader-{uuid.uuid4().hex[:12]}"
    first = publish(redis_client, key_prefix)
    loader = make_loader(
        loaders, settings.REDIS_URL, cache_path, key_prefix, client_name=name, backoff_initial_s=1.0
    )
    await loader.start()
    await async_eventually(lambda: redis_client.pubsub_numsub(keys.channel)[0][1] == 1, timeout=2.0)

    for info in redis_client.client_list():
        if info["name"] == name:
            redis_client.client_kill_filter(_id=info["id"])
    assert redis_client.pubsub_numsub(keys.channel)[0][1] == 0  # nobody hears the next announcement
    missed = await apublish(redis_client, key_prefix)
    assert missed > first

    await loader.wait_for_version(missed, timeout_s=5.0)  # via the latest pointer on reconnect
    after = await apublish(redis_client, key_prefix)  # and it is subscribed again
    await loader.wait_for_version(after, timeout_s=1.0)


@pytest.mark.asyncio
async def test_follows_redis_when_its_sequence_restarted(
    redis_client: RedisClient, key_prefix: str, cache_path: Path, loaders: list[SnapshotLoader]
) -> None:
    for _ in range(3):
        publish(redis_client, key_prefix)
    loader = make_loader(loaders, settings.REDIS_URL, cache_path, key_prefix)
    await loader.start()
    assert loader.version == 3
    for key in redis_client.scan_iter(match=f"{key_prefix}:*"):  # Redis lost its data
        redis_client.delete(key)
    restarted = await apublish(redis_client, key_prefix)
    assert restarted == 1
    await async_eventually(lambda: loader.version == restarted, timeout=2.0)


@pytest.mark.asyncio
async def test_started_from_disk_catches_up_when_redis_comes_back(
    redis_client: RedisClient,
    key_prefix: str,
    cache_path: Path,
    closed_port: int,
    tmp_path: Path,
    loaders: list[SnapshotLoader],
) -> None:
    publish(redis_client, key_prefix)
    earlier = make_loader(loaders, settings.REDIS_URL, cache_path, key_prefix)
    await earlier.start()
    await async_eventually(cache_path.exists, timeout=2.0)
    await earlier.stop()

    url = f"redis://127.0.0.1:{closed_port}/0"
    loader = make_loader(
        loaders, url, cache_path, key_prefix, backoff_initial_s=0.1, backoff_max_s=0.3
    )
    await loader.start()
    assert loader.source == "disk"

    with private_redis(tmp_path, port=closed_port):  # Redis comes back on that port
        other: redis.Redis[bytes] = redis.Redis.from_url(url)
        for _ in range(5):
            publish(other, key_prefix)
        await loader.wait_for_version(5, timeout_s=3.0)
        other.close()
        await loader.stop()


@pytest.mark.asyncio
async def test_lifecycle_errors(
    redis_client: RedisClient, key_prefix: str, cache_path: Path, loaders: list[SnapshotLoader]
) -> None:
    version = publish(redis_client, key_prefix)
    loader = make_loader(loaders, settings.REDIS_URL, cache_path, key_prefix)
    await loader.start()
    with pytest.raises(RuntimeError, match="already started"):
        await loader.start()
    with pytest.raises(TimeoutError):
        await loader.wait_for_version(version + 1, timeout_s=0.2)
    await loader.stop()
    assert loader.current.version == version  # still readable after stop
