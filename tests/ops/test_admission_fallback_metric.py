"""A router on its Redis-down fallback says so: ``switchyard_admission_redis_fallback`` is 1
while admission uses the local limits (a real RedisLimits against a Redis the test kills), 0
once Redis answers again; the SwitchyardRouterRedisFallback alert reads it."""

from __future__ import annotations

import pytest
from fixtures.private_redis import PrivateRedis
from fixtures.wait import async_eventually
from prometheus_client.parser import text_string_to_metric_families

from runtime.admission.limits import Quota
from runtime.admission.redis_limits import RedisLimits
from runtime.telemetry.metrics import RouterMetrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

QUOTA = Quota(rpm=100_000, tpm=10_000_000, concurrency=1000)


def fallback_gauge(metrics: RouterMetrics) -> float:
    text = metrics.render()[0].decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "switchyard_admission_redis_fallback":
                return float(sample.value)
    raise AssertionError("switchyard_admission_redis_fallback not exported")


async def admit(limits: RedisLimits) -> str:
    lease = await limits.acquire("acme", QUOTA, tokens=10)
    limits.settle(lease, actual_tokens=10, served=True)
    return lease.source


@pytest.mark.asyncio
async def test_the_gauge_follows_the_fallback(server: PrivateRedis) -> None:
    limits = RedisLimits(server.url, prefix="sytest:ops:fallback", retry_s=0.2, timeout_s=0.5)
    metrics = RouterMetrics()
    metrics.attach_admission(lambda: limits.degraded)
    await limits.start()
    try:
        assert await admit(limits) == "redis"
        assert fallback_gauge(metrics) == 0.0

        server.kill()
        assert await admit(limits) == "local"
        assert fallback_gauge(metrics) == 1.0

        server.start()

        async def back_on_redis() -> bool:  # the fallback retries Redis after retry_s
            return await admit(limits) == "redis"

        await async_eventually(back_on_redis, timeout=10.0, interval=0.05, what="back on Redis")
        assert fallback_gauge(metrics) == 0.0
    finally:
        await limits.stop()
