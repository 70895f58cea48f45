"""Drain-rate estimate, estimated wait and Retry-After, and deadline-aware admission."""

from __future__ import annotations

import itertools
import math

import pytest
from schedsim import make_request

from runtime.scheduling.admission import Admitted, Rejected, admit
from runtime.scheduling.drain import DrainRate, retry_after_s
from runtime.scheduling.fairness import VirtualTokenCounter
from runtime.scheduling.interfaces import DropReason
from runtime.scheduling.ordering import EarliestDeadlineFirst
from runtime.scheduling.queue import PoolQueue

pytestmark = pytest.mark.unit


def backlogged_dispatches(drain: DrainRate, *, start: float, seconds: float, rate: float) -> float:
    """Dispatch ``rate`` token cost per second in 0.1 s steps, queue never empty."""
    now = start
    for _ in range(round(seconds * 10)):
        now += 0.1
        drain.observe(now=now, queued=5, dispatched_cost=rate * 0.1)
    return now


def test_fresh_estimate_is_the_prior():
    drain = DrainRate(prior_rate=1000.0)
    assert drain.rate() == 1000.0
    assert drain.estimated_wait(2500.0) == 2.5
    assert drain.estimated_wait(0.0) == 0.0
    assert drain.estimated_wait(-5.0) == 0.0


def test_estimate_converges_to_the_backlogged_drain_rate():
    drain = DrainRate(half_life_s=10.0, prior_rate=1000.0)
    drain.observe(now=0.0, queued=5)
    backlogged_dispatches(drain, start=0.0, seconds=60.0, rate=5000.0)
    assert drain.rate() == pytest.approx(5000.0, rel=0.05)


def test_estimate_follows_a_change_in_capacity():
    drain = DrainRate(half_life_s=5.0)
    drain.observe(now=0.0, queued=5)
    now = backlogged_dispatches(drain, start=0.0, seconds=60.0, rate=4000.0)
    backlogged_dispatches(drain, start=now, seconds=45.0, rate=1000.0)  # 9 half-lives
    assert drain.rate() == pytest.approx(1000.0, rel=0.05)


def test_light_load_and_idle_time_do_not_move_the_estimate():
    drain = DrainRate(prior_rate=1000.0)
    drain.observe(now=0.0, queued=5)
    now = backlogged_dispatches(drain, start=0.0, seconds=30.0, rate=3000.0)
    learned = drain.rate()
    # A dispatch that empties the queue says the endpoints kept up, not how fast they are.
    drain.observe(now=now, queued=0, dispatched_cost=1_000_000.0)
    assert drain.rate() == learned
    # An hour idle, then a request arrives and leaves at once.
    drain.observe(now=now + 3600, queued=1)
    drain.observe(now=now + 3600, queued=0, dispatched_cost=50.0)
    assert drain.rate() == pytest.approx(learned)


@pytest.mark.parametrize("kwargs", [{"half_life_s": 0}, {"prior_rate": -1}, {"prior_s": math.nan}])
def test_drain_settings_are_validated(kwargs):
    with pytest.raises(ValueError, match="must be a positive number"):
        DrainRate(**kwargs)


@pytest.mark.parametrize(
    ("wait", "header"), [(0.0, 1), (0.2, 1), (1.0, 1), (2.1, 3), (math.inf, 3600)]
)
def test_retry_after_is_whole_seconds_at_least_one(wait, header):
    assert retry_after_s(wait) == header


# -- admission ------------------------------------------------------------------------------


@pytest.fixture
def seq():
    return itertools.count()


def new_queue(**kwargs) -> PoolQueue:
    return PoolQueue(fairness=VirtualTokenCounter(), ordering=EarliestDeadlineFirst(), **kwargs)


def test_admit_queues_a_request_that_can_make_its_deadline(seq):
    queue, drain = new_queue(), DrainRate(prior_rate=1000.0)
    first = make_request(seq, tenant="a", input_tokens=1000, output_tokens=0)
    assert admit(queue, drain, first, now=0.0) == Admitted(position=1, estimated_wait_s=0.0)
    second = make_request(seq, tenant="a", input_tokens=10, output_tokens=0, deadline=5.0)
    result = admit(queue, drain, second, now=0.0)
    assert result == Admitted(position=1, estimated_wait_s=0.0)  # EDF: it goes first
    assert second.id in queue


def test_admit_rejects_now_when_the_wait_exceeds_the_deadline(seq):
    queue, drain = new_queue(), DrainRate(prior_rate=1000.0)
    for _ in range(5):
        admit(
            queue,
            drain,
            make_request(seq, tenant="a", band=0, input_tokens=1000, output_tokens=0),
            now=0.0,
        )
    late = make_request(seq, tenant="b", band=1, input_tokens=10, output_tokens=0, deadline=11.0)
    result = admit(queue, drain, late, now=10.0)
    assert isinstance(result, Rejected)
    assert result.reason is DropReason.WAIT_EXCEEDS_DEADLINE
    assert result.status == 429
    assert result.estimated_wait_s == pytest.approx(5.0)
    assert result.retry_after_s == 5
    assert result.position == 6
    assert "exceeds the request deadline" in result.message
    assert "position 6" in result.message
    assert late.id not in queue


def test_admit_rejects_when_the_band_is_full(seq):
    queue, drain = new_queue(max_len_per_band={0: 1}), DrainRate()
    admit(queue, drain, make_request(seq, tenant="a", input_tokens=1, output_tokens=1), now=0.0)
    result = admit(
        queue, drain, make_request(seq, tenant="a", input_tokens=1, output_tokens=1), now=0.0
    )
    assert isinstance(result, Rejected)
    assert result.reason is DropReason.QUEUE_FULL
    assert result.retry_after_s >= 1
    assert "band 0 is full" in result.message


def test_admit_reports_requests_shed_to_make_room(seq):
    queue, drain = new_queue(max_total=1), DrainRate()
    batch = make_request(seq, tenant="a", band=2, input_tokens=1, output_tokens=1, shed_order=0)
    admit(queue, drain, batch, now=0.0)
    urgent = make_request(seq, tenant="b", band=0, input_tokens=1, output_tokens=1, shed_order=2)
    result = admit(queue, drain, urgent, now=0.0)
    assert isinstance(result, Admitted)
    assert result.displaced == (batch,)
    assert list(queue.band_lengths()) == [0]
