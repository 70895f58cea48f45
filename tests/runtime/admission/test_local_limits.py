"""LocalLimits (the per-process fallback) on a hand-driven clock, and the Quota rules."""

from __future__ import annotations

import pytest

from runtime.admission.limits import LimitExceededError, LimitKind, LocalLimits, Quota

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_quota_is_validated_and_divided_conservatively() -> None:
    with pytest.raises(ValueError, match=">= 1"):
        Quota(rpm=0, tpm=1, concurrency=1)
    assert Quota(rpm=10, tpm=1000, concurrency=3).divided(2) == Quota(rpm=5, tpm=500, concurrency=1)
    assert Quota(rpm=1, tpm=1, concurrency=1).divided(4) == Quota(rpm=1, tpm=1, concurrency=1)


def test_rpm_window_slides() -> None:
    clock = Clock()
    limits = LocalLimits(clock=clock)
    quota = Quota(rpm=2, tpm=10_000, concurrency=10)
    limits.acquire("1", "t", quota, tokens=1)
    clock.now += 30
    limits.acquire("2", "t", quota, tokens=1)
    with pytest.raises(LimitExceededError) as refused:
        limits.acquire("3", "t", quota, tokens=1)
    assert refused.value.kind is LimitKind.RPM
    assert refused.value.retry_after_s == pytest.approx(30.0)
    clock.now += 30.001  # the first admission left the window
    limits.acquire("4", "t", quota, tokens=1)


def test_tpm_bucket_refills_and_settles() -> None:
    clock = Clock()
    limits = LocalLimits(clock=clock)
    quota = Quota(rpm=100, tpm=120, concurrency=10)  # 2 tokens per second
    lease = limits.acquire("1", "t", quota, tokens=100)
    with pytest.raises(LimitExceededError) as refused:
        limits.acquire("2", "t", quota, tokens=100)
    assert refused.value.kind is LimitKind.TPM
    assert refused.value.retry_after_s == pytest.approx(40.0)  # 80 tokens missing
    limits.settle(lease, actual_tokens=30, served=True)  # 70 back: 90 available
    clock.now += 5  # +10
    limits.acquire("3", "t", quota, tokens=100)


def test_unknown_usage_keeps_the_worst_case_and_unserved_gives_all_back() -> None:
    clock = Clock()
    limits = LocalLimits(clock=clock)
    quota = Quota(rpm=100, tpm=100, concurrency=10)
    kept = limits.acquire("1", "t", quota, tokens=60)
    limits.settle(kept, actual_tokens=None, served=True)
    with pytest.raises(LimitExceededError):
        limits.acquire("2", "t", quota, tokens=60)
    unserved = limits.acquire("3", "t", quota, tokens=40)
    limits.settle(unserved, actual_tokens=None, served=False)
    assert limits.held("t") == 0
    limits.acquire("4", "t", quota, tokens=40)


def test_the_fallback_reports_its_rate_limit_state_too() -> None:
    clock = Clock()
    limits = LocalLimits(clock=clock, replicas=2)
    quota = Quota(rpm=4, tpm=240, concurrency=10)  # per process: 2 rpm, 120 tpm
    lease = limits.acquire("1", "t", quota, tokens=30)
    assert lease.rates is not None
    assert (lease.rates.requests_limit, lease.rates.requests_left) == (2, 1)
    assert (lease.rates.tokens_limit, lease.rates.tokens_left) == (120, 90)
    assert lease.rates.tokens_reset_s == pytest.approx(15.0)  # 30 tokens at 2 per second
    clock.now += 10
    limits.acquire("2", "t", quota, tokens=1)
    with pytest.raises(LimitExceededError) as refused:
        limits.acquire("3", "t", quota, tokens=1)
    assert refused.value.rates is not None
    assert refused.value.rates.requests_left == 0
    assert refused.value.rates.requests_reset_s == pytest.approx(60.0)  # the newest: just now
