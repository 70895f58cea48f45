"""The rule for entering admission's Redis-down fallback (pure logic, injected clock):
a refused connection at once, timeouts after a run of failures or a span of them, one stall
counted once, back at the first answer; Redis asked again after ``retry_s``."""

from __future__ import annotations

import logging

import pytest
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from runtime.admission.hysteresis import Hysteresis, refused

pytestmark = pytest.mark.unit

SLOW = RedisTimeoutError("Timeout reading from socket")
REFUSED = RedisConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def rule(clock: Clock, **options: float) -> Hysteresis:
    settings = {"fail_after": 3, "fail_for_s": 1.0, "retry_s": 2.0, **options}
    return Hysteresis(fail_after=int(settings["fail_after"]), fail_for_s=settings["fail_for_s"],
                      retry_s=settings["retry_s"], replicas=4, clock=clock)  # fmt: skip


def test_a_refused_connection_enters_the_fallback_at_once(clock: Clock) -> None:
    health = rule(clock)
    assert refused(REFUSED)
    assert refused(ConnectionRefusedError())
    assert not refused(SLOW)
    health.failed(REFUSED)
    assert health.down
    assert not health.may_ask()


def test_timeouts_enter_it_only_after_a_run_of_fail_after(clock: Clock) -> None:
    health = rule(clock)
    for n in (1, 2):
        clock.now += 0.1
        health.failed(SLOW, clock.now)
        assert not health.down, n
        assert health.failures == n
        assert health.may_ask()  # every other request still asks Redis
    clock.now += 0.1
    health.failed(SLOW, clock.now)
    assert health.down


def test_failures_spanning_fail_for_s_enter_it_before_the_count(clock: Clock) -> None:
    health = rule(clock, fail_after=10, fail_for_s=1.0)
    health.failed(SLOW, clock.now)
    clock.now += 0.6
    health.failed(SLOW, clock.now)
    assert not health.down
    clock.now += 0.5  # 1.1 s of failures, no answer in between
    health.failed(SLOW, clock.now)
    assert health.down


def test_the_calls_one_stall_timed_out_together_count_once(clock: Clock) -> None:
    health = rule(clock)
    started = clock.now
    clock.now += 0.5
    for _ in range(5):  # five calls that all started before the stall's first failure
        health.failed(SLOW, started)
    assert health.failures == 1
    assert not health.down


def test_an_answer_ends_the_run_and_the_fallback(
    clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    health = rule(clock)
    health.failed(SLOW, clock.now)
    clock.now += 0.1
    health.failed(SLOW, clock.now)
    health.answered()
    assert health.failures == 0
    clock.now += 0.1
    health.failed(SLOW, clock.now)  # a new run: 1 of 3
    assert not health.down
    with caplog.at_level(logging.WARNING, logger="runtime.admission.hysteresis"):
        health.failed(REFUSED)
        health.answered()
    assert not health.down
    assert health.may_ask()
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 2
    assert "Redis unreachable" in warnings[0]
    assert "4 assumed replicas" in warnings[0]
    assert "Redis answers again" in warnings[1]


def test_on_the_fallback_redis_is_asked_again_after_retry_s(clock: Clock) -> None:
    health = rule(clock, retry_s=2.0)
    health.failed(REFUSED)
    clock.now += 1.9
    assert not health.may_ask()
    clock.now += 0.2
    assert health.may_ask()
    health.failed(REFUSED)  # still down: the next try is retry_s from this failure
    assert health.down
    clock.now += 1.0
    assert not health.may_ask()
    clock.now += 1.1
    assert health.may_ask()


def test_fail_after_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="fail_after must be >= 1"):
        Hysteresis(fail_after=0)
