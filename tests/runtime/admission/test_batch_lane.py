"""The batch lane (issue #32): a tenant's batch lines are admitted under limits of their own
(``<tenant>#batch``, keys ``{tenant}:batch:*``), so a running batch never takes the tenant's
online concurrency, RPM or TPM; the credits stay the tenant's (the same balance and escrow)."""

from __future__ import annotations

import pytest
from test_redis_limits import Factory, make, started  # noqa: F401 - the fixture

from runtime.admission.limits import LimitExceededError, LimitKind, Quota
from runtime.contract import batch_lane, credit_key, escrow_key, lane_tenant, limits_keys

pytestmark = pytest.mark.integration

ONLINE = Quota(rpm=1000, tpm=1_000_000, concurrency=2)
LANE = Quota(rpm=1 << 40, tpm=1 << 40, concurrency=3)


@pytest.mark.asyncio
async def test_a_running_batch_takes_nothing_from_the_tenants_online_caps(
    make: Factory,  # noqa: F811
) -> None:
    limits = await started(make())
    lane = batch_lane("acme")
    batch = [await limits.acquire(lane, LANE, tokens=10) for _ in range(3)]  # a batch running
    online = [await limits.acquire("acme", ONLINE, tokens=10) for _ in range(2)]  # 0 refusals
    with pytest.raises(LimitExceededError) as full:  # the online cap is the tenant's own
        await limits.acquire("acme", ONLINE, tokens=10)
    assert full.value.kind is LimitKind.CONCURRENCY
    with pytest.raises(LimitExceededError) as lane_full:  # and the lane's is the allowance
        await limits.acquire(lane, LANE, tokens=10)
    assert lane_full.value.kind is LimitKind.CONCURRENCY
    limits.settle(online[0], actual_tokens=10, served=True)
    await limits.flush()
    await limits.acquire("acme", ONLINE, tokens=10)  # an online slot freed: online again
    limits.settle(batch[0], actual_tokens=10, served=True)
    await limits.flush()
    await limits.acquire(lane, LANE, tokens=10)  # a lane slot freed: the batch goes on


def test_the_lane_spends_the_tenants_credits_under_its_own_limit_keys() -> None:
    lane = batch_lane("acme")
    assert lane_tenant(lane) == "acme"
    assert lane_tenant("acme") == "acme"
    assert set(limits_keys("p", lane)).isdisjoint(limits_keys("p", "acme"))
    assert all(key.startswith("p:{acme}:batch:") for key in limits_keys("p", lane))
    assert credit_key("p", lane_tenant(lane)) == credit_key("p", "acme")
    assert escrow_key("p", lane_tenant(lane)) == escrow_key("p", "acme")
