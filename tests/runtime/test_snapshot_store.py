"""The Redis side of the snapshot: key layout, forward-only pointer, announcements, pruning."""

from __future__ import annotations

import time

import msgspec
import pytest
import redis
from fixtures.redis_keys import RedisClient

from runtime import snapshot_store
from runtime.snapshot import Snapshot, decode
from runtime.snapshot_store import SnapshotKeys

pytestmark = pytest.mark.integration


def snap() -> Snapshot:
    return Snapshot(version=0, created_at=time.time())


def announcements(pubsub: redis.client.PubSub, *, count: int, within_s: float = 1.0) -> list[bytes]:
    """Messages on the channel until ``count`` arrived or ``within_s`` passed."""
    received: list[bytes] = []
    deadline = time.monotonic() + within_s
    while len(received) < count and time.monotonic() < deadline:
        message = pubsub.get_message(timeout=0.1)
        if message is not None:
            received.append(message["data"])
    return received


def test_publish_writes_versioned_key_pointer_and_announcement(
    redis_client: RedisClient, key_prefix: str
) -> None:
    keys = SnapshotKeys(key_prefix)
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.channel)
    try:
        first = snapshot_store.publish(redis_client, snap(), prefix=key_prefix)
        second = snapshot_store.publish(redis_client, snap(), prefix=key_prefix)
        assert (first.version, first.latest) == (1, True)
        assert (second.version, second.latest) == (2, True)
        assert redis_client.get(keys.seq) == b"2"
        assert redis_client.get(keys.latest) == b"2"
        stored = redis_client.get(keys.version(2))
        assert stored is not None
        assert decode(stored).version == 2  # the version is stamped into the document
        assert announcements(pubsub, count=3) == [b"1", b"2"]
    finally:
        pubsub.close()


def test_latest_never_expires_and_old_versions_do(
    redis_client: RedisClient, key_prefix: str
) -> None:
    keys = SnapshotKeys(key_prefix)
    snapshot_store.publish(redis_client, snap(), prefix=key_prefix, ttl_s=60)
    assert redis_client.ttl(keys.version(1)) == -1  # latest: no expiry
    snapshot_store.publish(redis_client, snap(), prefix=key_prefix, ttl_s=60)
    assert 0 < redis_client.ttl(keys.version(1)) <= 60
    assert redis_client.ttl(keys.version(2)) == -1
    assert redis_client.ttl(keys.latest) == -1


def test_keep_prunes_versions_beyond_the_window(redis_client: RedisClient, key_prefix: str) -> None:
    keys = SnapshotKeys(key_prefix)
    for _ in range(5):
        snapshot_store.publish(redis_client, snap(), prefix=key_prefix, keep=2)
    present = [n for n in range(1, 6) if redis_client.exists(keys.version(n))]
    assert present == [4, 5]


def test_latest_pointer_never_moves_backwards(redis_client: RedisClient, key_prefix: str) -> None:
    keys = SnapshotKeys(key_prefix)
    pubsub = redis_client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.channel)
    try:
        newer = snapshot_store.publish_versioned(redis_client, snap(), version=5, prefix=key_prefix)
        # A slower publisher that took version 3 finishes last: it must lose.
        older = snapshot_store.publish_versioned(redis_client, snap(), version=3, prefix=key_prefix)
        assert newer.latest is True
        assert older.latest is False
        assert snapshot_store.latest_version(redis_client, prefix=key_prefix) == 5
        assert not redis_client.exists(keys.version(3))  # the loser's document is not stored
        assert announcements(pubsub, count=2) == [b"5"]  # the loser is not announced
    finally:
        pubsub.close()


def test_read_latest(redis_client: RedisClient, key_prefix: str) -> None:
    assert snapshot_store.read_latest(redis_client, prefix=key_prefix) is None
    snapshot_store.publish(redis_client, snap(), prefix=key_prefix)
    latest = snapshot_store.read_latest(redis_client, prefix=key_prefix)
    assert latest is not None
    assert latest.version == 1
    redis_client.set(SnapshotKeys(key_prefix).version(1), b"{broken")
    with pytest.raises(msgspec.DecodeError):
        snapshot_store.read_latest(redis_client, prefix=key_prefix)


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"version": 0}, "positive"), ({"version": 1, "ttl_s": 0}, "ttl_s")]
)
def test_publish_versioned_refuses_bad_arguments(
    redis_client: RedisClient, key_prefix: str, kwargs: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        snapshot_store.publish_versioned(redis_client, snap(), prefix=key_prefix, **kwargs)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(b"12", 12), ("7", 7), (3, 3), (None, None), (b"x", None), (b"0", None), (b"-4", None)],
)
def test_parse_version(raw: bytes | str | int | None, expected: int | None) -> None:
    assert snapshot_store.parse_version(raw) == expected
