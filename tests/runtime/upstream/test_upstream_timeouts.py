"""Per-attempt timeouts from an absolute deadline."""

from __future__ import annotations

import math

import pytest

from runtime.upstream import DeadlineExceeded, TimeoutPolicy, attempt_timeouts

pytestmark = pytest.mark.unit

POLICY = TimeoutPolicy(connect_cap=2.0, first_byte_cap=10.0)


def test_plenty_of_time_caps_connect_and_first_byte() -> None:
    t = attempt_timeouts(POLICY, deadline=160.0, now=100.0)
    assert (t.connect, t.first_byte, t.total, t.idle) == (2.0, 10.0, 60.0, None)


def test_little_time_left_bounds_everything_by_the_remainder() -> None:
    t = attempt_timeouts(POLICY, deadline=101.5, now=100.0)
    assert (t.connect, t.first_byte, t.total) == (1.5, 1.5, 1.5)


def test_first_byte_cap_override_for_unary() -> None:
    t = attempt_timeouts(POLICY, deadline=130.0, now=100.0, first_byte_cap=math.inf)
    assert t.first_byte == 30.0
    t = attempt_timeouts(POLICY, deadline=130.0, now=100.0, first_byte_cap=0.5)
    assert t.first_byte == 0.5


def test_idle_cap_is_bounded_by_the_remainder() -> None:
    policy = TimeoutPolicy(idle_cap=5.0)
    assert attempt_timeouts(policy, deadline=103.0, now=100.0).idle == 3.0
    assert attempt_timeouts(policy, deadline=200.0, now=100.0).idle == 5.0


@pytest.mark.parametrize("deadline", [100.0, 99.0])
def test_no_time_left_is_deadline_exceeded(deadline: float) -> None:
    with pytest.raises(DeadlineExceeded):
        attempt_timeouts(POLICY, deadline=deadline, now=100.0)


def test_non_finite_deadline_is_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        attempt_timeouts(POLICY, deadline=math.inf, now=100.0)


def test_client_timeout_maps_onto_aiohttp_fields() -> None:
    ct = attempt_timeouts(TimeoutPolicy(idle_cap=4.0), deadline=110.0, now=100.0).client_timeout()
    assert ct.total == 10.0
    assert ct.sock_connect == 2.0
    assert ct.sock_read == 4.0
    assert ct.connect is None
    assert ct.ceil_threshold > 1e6  # no rounding of our deadlines up to whole seconds


@pytest.mark.parametrize("field", ["connect_cap", "first_byte_cap", "idle_cap"])
def test_policy_refuses_non_positive_caps(field: str) -> None:
    with pytest.raises(ValueError, match=field):
        TimeoutPolicy(**{field: 0.0})
