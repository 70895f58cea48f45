"""Circuit breaker state machine, driven by a fake clock."""

from __future__ import annotations

import pytest

from runtime.upstream import BreakerBook, BreakerConfig, BreakerState, CircuitBreaker

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def breaker(clock: FakeClock) -> CircuitBreaker:
    return CircuitBreaker(BreakerConfig(failure_threshold=3, cooldown_s=5.0), clock=clock)


def test_closed_admits_and_opens_after_threshold_consecutive_failures(
    breaker: CircuitBreaker,
) -> None:
    for _ in range(2):
        assert breaker.try_acquire()
        breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.try_acquire()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    assert not breaker.available()
    assert not breaker.try_acquire()


def test_success_resets_the_consecutive_count(breaker: CircuitBreaker) -> None:
    breaker.record_failure()
    breaker.record_failure()
    breaker.record_success()
    breaker.record_failure()
    breaker.record_failure()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.consecutive_failures == 2


def _open(breaker: CircuitBreaker) -> None:
    for _ in range(3):
        breaker.record_failure()
    assert breaker.state is BreakerState.OPEN


def test_open_refuses_until_cooldown_then_admits_exactly_one_probe(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    _open(breaker)
    clock.advance(4.999)
    assert not breaker.try_acquire()
    clock.advance(0.001)
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.available()
    assert breaker.try_acquire()  # the probe
    assert not breaker.available()
    assert not breaker.try_acquire()
    assert not breaker.try_acquire()
    assert breaker.state is BreakerState.HALF_OPEN


def test_probe_success_closes(breaker: CircuitBreaker, clock: FakeClock) -> None:
    _open(breaker)
    clock.advance(5)
    assert breaker.try_acquire()
    breaker.record_success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.consecutive_failures == 0
    assert breaker.try_acquire()
    assert breaker.try_acquire()


def test_probe_failure_reopens_for_a_full_cooldown(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    _open(breaker)
    clock.advance(5)
    assert breaker.try_acquire()
    breaker.record_failure()
    assert breaker.state is BreakerState.OPEN
    clock.advance(4.9)
    assert not breaker.try_acquire()
    clock.advance(0.1)
    assert breaker.try_acquire()


def test_probe_released_without_verdict_lets_another_probe_in(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    _open(breaker)
    clock.advance(5)
    assert breaker.try_acquire()
    breaker.release()  # e.g. the probe's client disconnected
    assert breaker.state is BreakerState.HALF_OPEN
    assert breaker.try_acquire()
    assert not breaker.try_acquire()


def test_late_failure_while_open_restarts_cooldown(
    breaker: CircuitBreaker, clock: FakeClock
) -> None:
    _open(breaker)
    clock.advance(3)
    breaker.record_failure()  # a request admitted before opening failed late
    clock.advance(3)
    assert not breaker.try_acquire()
    clock.advance(2)
    assert breaker.try_acquire()


def test_release_in_closed_state_changes_nothing(breaker: CircuitBreaker) -> None:
    breaker.record_failure()
    breaker.release()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.consecutive_failures == 1


@pytest.mark.parametrize(("threshold", "cooldown"), [(0, 1.0), (-1, 1.0), (1, -0.1)])
def test_config_refuses_nonsense(threshold: int, cooldown: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        BreakerConfig(failure_threshold=threshold, cooldown_s=cooldown)


def test_book_creates_per_endpoint_breakers_and_forgets_removed(clock: FakeClock) -> None:
    book = BreakerBook(BreakerConfig(failure_threshold=1, cooldown_s=1.0), clock=clock)
    assert book.available(7)  # unknown endpoint: nothing against it
    book.get(7).record_failure()
    assert not book.available(7)
    assert book.available(8)
    assert book.get(7) is book.get(7)
    assert book.states() == {7: BreakerState.OPEN}
    book.retain([8])
    assert book.states() == {}
    assert book.available(7)


def test_book_reports_each_recorded_success_with_its_endpoint(clock: FakeClock) -> None:
    seen: list[int] = []
    book = BreakerBook(BreakerConfig(failure_threshold=1, cooldown_s=0.0), on_success=seen.append)
    book.get(3).record_success()
    book.get(4).record_failure()  # failures and verdict-less releases are not reported
    book.get(4).release()
    assert seen == [3]
    assert book.get(4).try_acquire()  # half-open probe
    book.get(4).record_success()
    assert seen == [3, 4]
