"""The Redis side of the snapshot: key layout, forward-only pointer, announcements, pruning."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import msgspec
import pytest
import redis
from django.conf import settings

from runtime import snapshot_store
from runtime.snapshot import Snapshot, decode
from runtime.snapshot_store import SnapshotKeys

pytestmark = pytest.mark.integration


@pytest.fixture
def client() -> Iterator[redis.Redis[bytes]]:
    client: redis.Redis[bytes] = redis.Redis.from_url(settings.REDIS_URL)
    yield client
    client.close()


@pytest.fixture
def prefix(client: redis.Redis[bytes]) -> Iterator[str]:
    prefix = f"sytest:snapshot:{uuid.uuid4().hex}"
    yield prefix
    for key in client.scan_iter(match=f"{prefix}:*"):
        client.delete(key)


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
    client: redis.Redis[bytes], prefix: str
) -> None:
    keys = SnapshotKeys(prefix)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.channel)
    try:
        first = snapshot_store.publish(client, snap(), prefix=prefix)
        second = snapshot_store.publish(client, snap(), prefix=prefix)
        assert (first.version, first.latest) == (1, True)
        assert (second.version, second.latest) == (2, True)
        assert client.get(keys.seq) == b"2"
        assert client.get(keys.latest) == b"2"
        stored = client.get(keys.version(2))
        assert stored is not None
        assert decode(stored).version == 2  # the version is stamped into the document
        assert announcements(pubsub, count=3) == [b"1", b"2"]
    finally:
        pubsub.close()


def test_latest_never_expires_and_old_versions_do(client: redis.Redis[bytes], prefix: str) -> None:
    keys = SnapshotKeys(prefix)
    snapshot_store.publish(client, snap(), prefix=prefix, ttl_s=60)
    assert client.ttl(keys.version(1)) == -1  # latest: no expiry
    snapshot_store.publish(client, snap(), prefix=prefix, ttl_s=60)
    assert 0 < client.ttl(keys.version(1)) <= 60
    assert client.ttl(keys.version(2)) == -1
    assert client.ttl(keys.latest) == -1


def test_keep_prunes_versions_beyond_the_window(client: redis.Redis[bytes], prefix: str) -> None:
    keys = SnapshotKeys(prefix)
    for _ in range(5):
        snapshot_store.publish(client, snap(), prefix=prefix, keep=2)
    present = [n for n in range(1, 6) if client.exists(keys.version(n))]
    assert present == [4, 5]


def test_latest_pointer_never_moves_backwards(client: redis.Redis[bytes], prefix: str) -> None:
    keys = SnapshotKeys(prefix)
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(keys.channel)
    try:
        newer = snapshot_store.publish_versioned(client, snap(), version=5, prefix=prefix)
        # A slower publisher that took version 3 finishes last: it must lose.
        older = snapshot_store.publish_versioned(client, snap(), version=3, prefix=prefix)
        assert newer.latest is True
        assert older.latest is False
        assert snapshot_store.latest_version(client, prefix=prefix) == 5
        assert not client.exists(keys.version(3))  # the loser's document is not stored
        assert announcements(pubsub, count=2) == [b"5"]  # the loser is not announced
    finally:
        pubsub.close()


def test_read_latest(client: redis.Redis[bytes], prefix: str) -> None:
    assert snapshot_store.read_latest(client, prefix=prefix) is None
    snapshot_store.publish(client, snap(), prefix=prefix)
    latest = snapshot_store.read_latest(client, prefix=prefix)
    assert latest is not None
    assert latest.version == 1
    client.set(SnapshotKeys(prefix).version(1), b"{broken")
    with pytest.raises(msgspec.DecodeError):
        snapshot_store.read_latest(client, prefix=prefix)


@pytest.mark.parametrize(
    ("kwargs", "message"), [({"version": 0}, "positive"), ({"version": 1, "ttl_s": 0}, "ttl_s")]
)
def test_publish_versioned_refuses_bad_arguments(
    client: redis.Redis[bytes], prefix: str, kwargs: dict[str, int], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        snapshot_store.publish_versioned(client, snap(), prefix=prefix, **kwargs)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(b"12", 12), ("7", 7), (3, 3), (None, None), (b"x", None), (b"0", None), (b"-4", None)],
)
def test_parse_version(raw: bytes | str | int | None, expected: int | None) -> None:
    assert snapshot_store.parse_version(raw) == expected
