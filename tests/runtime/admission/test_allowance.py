"""Allowances (pure logic, injected clock): take from memory, ask, expire, give back."""

from __future__ import annotations

import pytest

from runtime.admission.allowance import MIN_GRANT, Allowances, GrantAsk
from runtime.admission.limits import Quota

pytestmark = pytest.mark.unit

QUOTA = Quota(rpm=6000, tpm=1_000_000, concurrency=100)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def granted(
    allowances: Allowances, requests: int = 10, tokens: int = 1000, slots: int = 4
) -> GrantAsk:
    (ask,) = allowances.asks()
    allowances.granted(ask, requests, tokens, slots)
    return ask


def test_the_first_requests_go_the_exact_way_and_ask_for_a_grant() -> None:
    clock = Clock()
    allowances = Allowances(ttl_s=1.0, clock=clock)
    assert allowances.take("acme", QUOTA, 10) is None
    assert allowances.asks() == []  # one request is no demand yet
    assert allowances.take("acme", QUOTA, 10) is None
    assert allowances.wants
    (ask,) = allowances.asks()
    assert ask.tenant == "acme"
    assert ask.quota == QUOTA
    assert ask.requests >= MIN_GRANT
    assert ask.tokens >= ask.requests * 10 - 1
    assert ask.slots >= 2
    assert allowances.asks() == []  # one grant in flight per tenant


def test_requests_spend_the_grant_from_memory_and_settle_back_into_it() -> None:
    clock = Clock()
    allowances = Allowances(ttl_s=1.0, clock=clock)
    for _ in range(2):
        allowances.take("acme", QUOTA, 10)
    ask = granted(allowances, requests=10, tokens=100, slots=2)
    first = allowances.take("acme", QUOTA, 40)
    second = allowances.take("acme", QUOTA, 40)
    assert first is not None
    assert second is not None
    assert first.source == "allowance"
    assert first.id.startswith(ask.grant_id)
    assert {first.slot, second.slot} == {f"{ask.grant_id}:c1", f"{ask.grant_id}:c2"}
    assert allowances.held("acme") == (8, 20.0, 0, 2)
    assert allowances.take("acme", QUOTA, 10) is None  # no free slot: the exact way
    assert allowances.put_back(first, refund=30) == (0, False)  # used 10 of its 40
    assert allowances.held("acme") == (8, 50.0, 1, 1)
    assert allowances.take("acme", QUOTA, 60) is None  # not enough tokens left
    assert allowances.take("acme", QUOTA, 50) is not None


def test_entries_are_valid_for_less_than_the_ttl_and_stale_ones_are_given_back() -> None:
    clock = Clock()
    allowances = Allowances(ttl_s=1.0, idle_s=5.0, clock=clock)
    for _ in range(2):
        allowances.take("acme", QUOTA, 10)
    ask = granted(allowances, requests=5, tokens=100, slots=2)
    assert allowances.take("acme", QUOTA, 10) is not None
    clock.now += 0.96  # the grant was asked at 100.0: local validity ends at 100.95
    assert allowances.take("acme", QUOTA, 10) is None
    (give,) = allowances.expire()
    assert give.tenant == "acme"
    assert give.tokens == 0.0
    assert give.slots == ()
    assert set(give.entries) == {f"{ask.grant_id}:r{i}" for i in range(2, 6)}
    assert allowances.expire() == []


def test_an_idle_tenant_gives_everything_back_and_busy_slots_are_released_on_settle() -> None:
    clock = Clock()
    allowances = Allowances(ttl_s=1.0, idle_s=2.0, clock=clock)
    for _ in range(2):
        allowances.take("acme", QUOTA, 10)
    ask = granted(allowances, requests=5, tokens=100, slots=3)
    running = allowances.take("acme", QUOTA, 10)
    assert running is not None
    assert allowances.slots() == {"acme": [f"{ask.grant_id}:c{i}" for i in (1, 2, 3)]}
    clock.now += 2.0
    (give,) = allowances.expire()
    assert give.tokens == 90.0
    assert len(give.entries) == 4
    assert set(give.slots) == {f"{ask.grant_id}:c1", f"{ask.grant_id}:c2"}
    assert allowances.slots() == {"acme": [running.slot]}  # still renewed while it runs
    # Settled after its allowance was given back: its tokens and its slot go to Redis.
    assert allowances.put_back(running, refund=4) == (4, True)
    assert allowances.slots() == {}
    assert allowances.put_back(running, refund=4) == (4, False)


def test_a_refused_grant_backs_off_for_one_ttl_and_a_changed_quota_starts_over() -> None:
    clock = Clock()
    allowances = Allowances(ttl_s=1.0, clock=clock)
    for _ in range(2):
        allowances.take("acme", QUOTA, 10)
    (ask,) = allowances.asks()
    allowances.granted(ask, 0, 0, 0)  # near the limit: nothing
    for _ in range(2):
        assert allowances.take("acme", QUOTA, 10) is None
    assert allowances.asks() == []
    clock.now += 1.0
    assert len(allowances.asks()) == 1
    allowances2 = Allowances(ttl_s=1.0, clock=clock)
    for _ in range(2):
        allowances2.take("acme", QUOTA, 10)
    granted(allowances2, requests=5, tokens=100, slots=2)
    smaller = Quota(rpm=100, tpm=1000, concurrency=2)
    assert allowances2.take("acme", smaller, 10) is None
    (give,) = allowances2.expire()  # the old quota's allowance, all of it
    assert (len(give.entries), give.tokens, len(give.slots)) == (5, 100.0, 2)


def test_a_grant_for_a_retired_allowance_is_handed_straight_back() -> None:
    clock = Clock()
    allowances = Allowances(ttl_s=1.0, idle_s=2.0, clock=clock)
    for _ in range(2):
        allowances.take("acme", QUOTA, 10)
    (ask,) = allowances.asks()
    clock.now += 2.0
    assert allowances.expire() == []  # retired idle (it held nothing yet)
    allowances.granted(ask, 3, 30, 1)
    (give,) = allowances.expire()
    assert (len(give.entries), give.tokens, give.slots) == (3, 30.0, (f"{ask.grant_id}:c1",))


def test_the_grant_size_follows_the_demand_within_the_caps() -> None:
    clock = Clock()
    allowances = Allowances(ttl_s=1.0, max_requests=64, max_slots=32, clock=clock)
    for _ in range(2):
        allowances.take("acme", QUOTA, 10)
    granted(allowances, requests=2, tokens=20, slots=2)
    for _ in range(300):  # 300 requests in 0.3 s: 1000/s
        clock.now += 0.001
        lease = allowances.take("acme", QUOTA, 10)
        if lease is not None:
            allowances.put_back(lease, refund=0)
    (ask,) = allowances.asks()
    assert ask.requests == 64  # capped (demand x ttl x 2 would be 2000)
    assert ask.tokens <= 64 * 10
    assert ask.slots == 2  # 2 x busy + 4 = 4 wanted (none running at the ask), 2 held


def test_an_allowance_lease_reports_redis_view_with_the_unspent_part_given_back() -> None:
    """The x-ratelimit-* numbers of a request admitted from memory (issue #33): Redis's window
    and bucket at the last grant, plus what this router still holds unspent."""
    clock = Clock()
    allowances = Allowances(ttl_s=1.0, clock=clock)
    for _ in range(2):
        allowances.take("acme", QUOTA, 10)
    (ask,) = allowances.asks()
    # Redis after the grant: 50 entries in the window (the 10 granted among them), 900_000
    # tokens left in the bucket (the 1000 granted already taken out).
    allowances.granted(ask, 10, 1000, 4, used=50, bucket=900_000)
    lease = allowances.take("acme", QUOTA, 40)
    assert lease is not None
    assert lease.rates is not None
    # 9 entries still in hand: 41 really used; 960 granted tokens unspent.
    assert (lease.rates.requests_limit, lease.rates.requests_left) == (6000, 6000 - 41)
    assert (lease.rates.tokens_limit, lease.rates.tokens_left) == (1_000_000, 900_960)
