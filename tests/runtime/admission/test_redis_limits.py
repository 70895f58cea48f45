"""RedisLimits: RPM, TPM and concurrency in one Lua call, leases, settlement, Redis down."""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Callable

import pytest
import pytest_asyncio
import redis
from fixtures.wait import async_eventually

from runtime.admission.limits import LimitExceededError, LimitKind, Quota
from runtime.admission.redis_limits import RedisLimits

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

Factory = Callable[..., RedisLimits]


def redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest_asyncio.fixture
async def make() -> AsyncIterator[Factory]:
    """RedisLimits instances (routers) sharing one fresh key prefix; all stopped after."""
    prefix = f"switchyard:test:limits:{uuid.uuid4().hex[:10]}"
    made: list[RedisLimits] = []

    def factory(url: str | None = None, **kwargs: object) -> RedisLimits:
        limits = RedisLimits(url or redis_url(), prefix=prefix, **kwargs)  # type: ignore[arg-type]
        made.append(limits)
        return limits

    yield factory
    for limits in made:
        await limits.stop()
    client = redis.Redis.from_url(redis_url())
    keys = list(client.scan_iter(match=f"{prefix}:*"))
    if keys:
        client.delete(*keys)
    client.close()


async def started(limits: RedisLimits) -> RedisLimits:
    await limits.start()
    return limits


async def test_rpm_is_a_sliding_window_and_unserved_requests_give_their_entry_back(
    make: Factory,
) -> None:
    limits = await started(make())
    quota = Quota(rpm=3, tpm=10_000, concurrency=100)
    leases = [await limits.acquire("acme", quota, tokens=1) for _ in range(3)]
    with pytest.raises(LimitExceededError) as refused:
        await limits.acquire("acme", quota, tokens=1)
    assert refused.value.kind is LimitKind.RPM
    assert 55 < refused.value.retry_after_s <= 60  # the oldest admission leaves the window
    assert refused.value.retry_after_header == 60
    assert "3 requests per minute" in str(refused.value)
    limits.settle(leases[0], actual_tokens=None, served=False)  # e.g. refused by the queue
    await limits.flush()
    await limits.acquire("acme", quota, tokens=1)
    await limits.acquire("other", quota, tokens=1)  # per tenant


async def test_tpm_debits_the_worst_case_and_settlement_credits_the_unused(
    make: Factory,
) -> None:
    limits = await started(make())
    quota = Quota(rpm=100, tpm=600, concurrency=100)  # 10 tokens per second
    first = await limits.acquire("acme", quota, tokens=400)
    with pytest.raises(LimitExceededError) as refused:
        await limits.acquire("acme", quota, tokens=400)
    assert refused.value.kind is LimitKind.TPM
    assert 19 <= refused.value.retry_after_s <= 21  # (400 - 200) tokens at 10 per second
    limits.settle(first, actual_tokens=150, served=True)  # 250 of the 400 come back
    assert await limits.flush() == 1
    await limits.acquire("acme", quota, tokens=400)


async def test_a_request_larger_than_the_bucket_passes_only_when_it_is_full(
    make: Factory,
) -> None:
    limits = await started(make())
    quota = Quota(rpm=100, tpm=60, concurrency=100)
    await limits.acquire("acme", quota, tokens=600)  # full bucket: allowed, into debt
    with pytest.raises(LimitExceededError) as refused:
        await limits.acquire("acme", quota, tokens=1)
    assert refused.value.kind is LimitKind.TPM
    assert refused.value.retry_after_s > 60  # the debt takes ten minutes to repay
    assert refused.value.retry_after_header == 60  # the header stays within one window


async def test_concurrency_leases_are_released_on_settle(make: Factory) -> None:
    limits = await started(make())
    quota = Quota(rpm=100, tpm=10_000, concurrency=2)
    first = await limits.acquire("acme", quota, tokens=1)
    await limits.acquire("acme", quota, tokens=1)
    with pytest.raises(LimitExceededError) as refused:
        await limits.acquire("acme", quota, tokens=1)
    assert refused.value.kind is LimitKind.CONCURRENCY
    assert refused.value.retry_after_header == 1
    limits.settle(first, actual_tokens=2, served=True)
    limits.settle(first, actual_tokens=2, served=True)  # idempotent
    await async_eventually(  # the background task flushes at once
        lambda: limits.acquire("acme", quota, tokens=1),
        timeout=2, interval=0.01, ignore=(LimitExceededError,),
    )  # fmt: skip


async def test_a_crashed_routers_leases_expire_and_a_live_router_renews_its_own(
    make: Factory,
) -> None:
    quota = Quota(rpm=100, tpm=10_000, concurrency=1)
    crashed = await started(make(lease_ttl_s=0.3))
    await crashed.acquire("gone", quota, tokens=1)
    await crashed.stop()  # never settles: the router died with the request
    live = await started(make(lease_ttl_s=0.3))
    await live.acquire("kept", quota, tokens=1)  # renewed every 0.1 s by live's task
    other = await started(make(lease_ttl_s=0.3))
    for tenant in ("gone", "kept"):
        with pytest.raises(LimitExceededError):
            await other.acquire(tenant, quota, tokens=1)
    await async_eventually(  # the lease expires (TTL 0.3 s)
        lambda: other.acquire("gone", quota, tokens=1),
        timeout=3, interval=0.05, ignore=(LimitExceededError,),
    )  # fmt: skip
    with pytest.raises(LimitExceededError):
        await other.acquire("kept", quota, tokens=1)  # still held and renewed


async def test_two_routers_share_one_limit_atomically(make: Factory) -> None:
    first, second = await started(make()), await started(make())
    quota = Quota(rpm=7, tpm=1_000_000, concurrency=1000)

    async def attempt(limits: RedisLimits) -> bool:
        try:
            await limits.acquire("acme", quota, tokens=10)
        except LimitExceededError:
            return False
        return True

    results = await asyncio.gather(*(attempt(first if i % 2 else second) for i in range(20)))
    assert sum(results) == 7


async def test_redis_down_falls_back_to_local_caps_and_logs_once(
    make: Factory, caplog: pytest.LogCaptureFixture
) -> None:
    limits = await started(make(f"redis://127.0.0.1:{closed_port()}/0", replicas=2))
    quota = Quota(rpm=4, tpm=10_000, concurrency=100)
    with caplog.at_level(logging.WARNING, logger="runtime.admission.redis_limits"):
        leases = [await limits.acquire("acme", quota, tokens=1) for _ in range(2)]
        with pytest.raises(LimitExceededError) as refused:
            await limits.acquire("acme", quota, tokens=1)  # 4 / 2 replicas
        limits.settle(leases[0], actual_tokens=None, served=False)
        await limits.acquire("acme", quota, tokens=1)
    assert refused.value.kind is LimitKind.RPM
    assert limits.degraded
    assert all(lease.source == "local" for lease in leases)
    warnings = [r for r in caplog.records if "Redis unreachable" in r.getMessage()]
    assert len(warnings) == 1
    assert "/ 2 assumed replicas" in warnings[0].getMessage()


async def test_local_concurrency_cap_while_redis_is_down(make: Factory) -> None:
    limits = await started(make(f"redis://127.0.0.1:{closed_port()}/0", replicas=3))
    quota = Quota(rpm=100, tpm=10_000, concurrency=7)  # 7 // 3 = 2 here
    first = await limits.acquire("acme", quota, tokens=1)
    await limits.acquire("acme", quota, tokens=1)
    with pytest.raises(LimitExceededError) as refused:
        await limits.acquire("acme", quota, tokens=1)
    assert refused.value.kind is LimitKind.CONCURRENCY
    limits.settle(first, actual_tokens=2, served=True)
    await limits.acquire("acme", quota, tokens=1)


async def test_scripts_are_reloaded_when_redis_forgot_them(make: Factory) -> None:
    limits = await started(make())
    quota = Quota(rpm=100, tpm=10_000, concurrency=1)
    lease = await limits.acquire("acme", quota, tokens=1)
    client = redis.Redis.from_url(redis_url())
    try:
        client.script_flush()  # a restarted Redis
    finally:
        client.close()
    limits.settle(lease, actual_tokens=1, served=True)
    assert await limits.flush() == 1
    await limits.acquire("acme", quota, tokens=1)  # the lease was released


async def test_admission_returns_the_rate_limit_state_it_read(make: Factory) -> None:
    """The x-ratelimit-* headers' numbers come with the admission script's own answer (no
    extra round trip): left after this request, and the time back to full (issue #33)."""
    limits = await started(make())
    quota = Quota(rpm=3, tpm=600, concurrency=100)  # 10 tokens per second
    lease = await limits.acquire("acme", quota, tokens=150)
    rates = lease.rates
    assert rates is not None
    assert (rates.requests_limit, rates.requests_left) == (3, 2)
    assert rates.requests_reset_s == pytest.approx(60.0)
    assert (rates.tokens_limit, rates.tokens_left) == (600, 450)
    assert rates.tokens_reset_s == pytest.approx(15.0, abs=0.1)  # 150 tokens at 10 per second
    await limits.acquire("acme", quota, tokens=1)
    await limits.acquire("acme", quota, tokens=1)
    with pytest.raises(LimitExceededError) as refused:
        await limits.acquire("acme", quota, tokens=1)
    seen = refused.value.rates
    assert seen is not None
    assert (seen.requests_left, seen.tokens_left) == (0, 448)
    assert 59 < seen.requests_reset_s <= 60  # until the newest admission leaves the window
