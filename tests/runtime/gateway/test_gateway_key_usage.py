"""KeyUsageRecorder: batched, newest-wins writes to Redis, off the request path."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis
from gateway_fleet import free_port, redis_url

from runtime.gateway.key_usage import KeyUsageRecorder

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


@pytest.fixture
def hash_key() -> Iterator[str]:
    key = f"switchyard:test:apikey:last_used:{uuid.uuid4().hex[:8]}"
    yield key
    client = redis.Redis.from_url(redis_url())
    client.delete(key)
    client.close()


async def test_flush_keeps_the_newest_time_per_key(hash_key: str) -> None:
    client = redis.Redis.from_url(redis_url())
    client.hset(hash_key, "older000", "500.000")
    client.hset(hash_key, "newer000", "9999999999.000")
    recorder = KeyUsageRecorder(redis_url(), hash_key=hash_key, interval_s=3600)
    await recorder.start()
    try:
        recorder.record("fresh000", 100.0)
        recorder.record("fresh000", 50.0)  # older than what is pending: ignored
        recorder.record("older000", 600.0)
        recorder.record("newer000", 700.0)
        assert recorder.pending == 3
        assert await recorder.flush() == 2
        assert recorder.pending == 0
        stored = {k.decode(): float(v) for k, v in client.hgetall(hash_key).items()}
        assert stored == {"fresh000": 100.0, "older000": 600.0, "newer000": 9999999999.0}
        assert await recorder.flush() == 0  # nothing pending
        recorder.record("last0000", 1.0)
    finally:
        await recorder.stop()  # flushes once more
        client_value = client.hget(hash_key, "last0000")
        client.close()
    assert client_value == b"1.000"


async def test_a_failed_flush_keeps_the_batch() -> None:
    recorder = KeyUsageRecorder(
        f"redis://127.0.0.1:{free_port()}/0", hash_key="unused", interval_s=3600
    )
    await recorder.start()
    try:
        recorder.record("abcdefgh", 1.0)
        assert await recorder.flush() == 0
        assert recorder.pending == 1
    finally:
        await recorder.stop()
    await recorder.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            await recorder.start()
    finally:
        await recorder.stop()
