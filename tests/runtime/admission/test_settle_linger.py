"""Settlement batches on a real Redis: memory-path settlements wait out the linger and go in
one pipeline; one that frees a concurrency slot held in Redis, or a full batch, goes at once;
``stop()`` sends what is still waiting."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable

import pytest
import pytest_asyncio
import redis
from fixtures.wait import async_eventually

from runtime.admission import redis_limits
from runtime.admission.limits import Lease, LimitExceededError, Quota
from runtime.admission.redis_limits import RedisLimits

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

LONG_LINGER_S = 30.0  # far longer than any bound below: only urgency or stop() can send
Factory = Callable[..., Awaitable[RedisLimits]]
QUOTA = Quota(rpm=100_000, tpm=100_000_000, concurrency=100_000)


def redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest_asyncio.fixture
async def made() -> AsyncIterator[tuple[Factory, str, redis.Redis]]:
    prefix = f"switchyard:test:linger:{uuid.uuid4().hex[:10]}"
    stream = f"{prefix}:usage"
    routers: list[RedisLimits] = []
    client = redis.Redis.from_url(redis_url())

    async def factory(**kwargs: object) -> RedisLimits:
        """A started router's limits, stopped at the end of the test."""
        limits = RedisLimits(redis_url(), prefix=prefix, usage_stream=stream, **kwargs)  # type: ignore[arg-type]
        routers.append(limits)
        await limits.start()
        return limits

    yield factory, stream, client
    for limits in routers:
        await limits.stop()
    keys = [*client.scan_iter(match=f"{prefix}:*"), stream]
    client.delete(*keys)
    client.close()


def event(n: int) -> bytes:
    return f'{{"n": {n}}}'.encode()


async def memory_leases(limits: RedisLimits, count: int) -> list[Lease]:
    """``count`` leases admitted from the router's allowance (memory). The first requests go
    to Redis while the background round fetches the grant; they are settled at once (urgent,
    no usage event)."""
    found: list[Lease] = []

    async def one_more() -> bool:
        lease = await limits.acquire("acme", QUOTA, tokens=10)
        if lease.source == "allowance":
            found.append(lease)
        else:
            limits.settle(lease, actual_tokens=10, served=True)
        return len(found) >= count

    await async_eventually(one_more, timeout=5, interval=0.005, what="allowance leases")
    return found


async def test_memory_path_settlements_wait_for_the_linger_and_stop_sends_them(
    made: tuple[Factory, str, redis.Redis],
) -> None:
    factory, stream, client = made
    limits = await factory(settle_linger_s=LONG_LINGER_S)
    memory = await memory_leases(limits, 5)
    for i, lease in enumerate(memory):
        limits.settle(lease, actual_tokens=10, served=True, event=event(i))
    await limits.renew()  # a round trip to Redis: the queued events are not sent with it
    assert client.xlen(stream) == 0
    await limits.stop()  # the last flush sends the waiting batch
    assert client.xlen(stream) == len(memory)


async def test_a_settlement_freeing_a_redis_slot_is_sent_at_once(
    made: tuple[Factory, str, redis.Redis],
) -> None:
    factory, stream, client = made
    limits = await factory(settle_linger_s=LONG_LINGER_S, allowance_ttl_s=None)  # exact path
    quota = Quota(rpm=100, tpm=10_000, concurrency=1)
    lease = await limits.acquire("acme", quota, tokens=1)
    assert lease.source == "redis"
    with pytest.raises(LimitExceededError):
        await limits.acquire("acme", quota, tokens=1)
    limits.settle(lease, actual_tokens=1, served=True, event=event(0))
    # A sequential client at its concurrency limit is admitted again without the linger.
    await async_eventually(
        lambda: limits.acquire("acme", quota, tokens=1),
        timeout=5, interval=0.01, ignore=(LimitExceededError,),
    )  # fmt: skip
    assert client.xlen(stream) == 1


async def test_a_full_batch_is_sent_without_waiting_out_the_linger(
    made: tuple[Factory, str, redis.Redis],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(redis_limits, "_FLUSH_AT", 4)
    factory, stream, client = made
    limits = await factory(settle_linger_s=LONG_LINGER_S)
    memory = await memory_leases(limits, 4)
    for i, lease in enumerate(memory):
        limits.settle(lease, actual_tokens=10, served=True, event=event(i))
    await async_eventually(lambda: client.xlen(stream) == 4, timeout=5, what="a full batch sent")


async def test_a_zero_linger_sends_each_settlement_at_once(
    made: tuple[Factory, str, redis.Redis],
) -> None:
    factory, stream, client = made
    limits = await factory(settle_linger_s=0.0)
    lease = await limits.acquire("acme", QUOTA, tokens=10)
    limits.settle(lease, actual_tokens=10, served=True, event=event(0))
    await async_eventually(lambda: client.xlen(stream) == 1, timeout=5, what="the event sent")


async def test_a_negative_linger_is_refused() -> None:
    with pytest.raises(ValueError, match="settle_linger_s"):
        RedisLimits(redis_url(), settle_linger_s=-0.001)
