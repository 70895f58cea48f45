"""The degradation policies' conformance suite, and their settings (runtime.degradation)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.degradation import (
    BREAKER_OPEN,
    NO_ENDPOINT,
    QUEUE_WAIT,
    DegradeSettings,
    DegradeSettingsError,
    Limits,
    PoolState,
    degradation_policy,
    names,
)
from runtime.policy_names import UnknownPolicyError
from runtime.pool_policies import pool_policy_errors

pytestmark = pytest.mark.unit

NAMES = names()

states = st.builds(
    PoolState,
    queue_wait_s=st.floats(0.0, 100.0),
    unavailable=st.sampled_from(["", BREAKER_OPEN, NO_ENDPOINT]),
)
limits = st.builds(
    Limits,
    wait_s=st.floats(0.001, 50.0),
    max_tokens=st.integers(1, 512),
    asked_tokens=st.integers(0, 2048),
    has_fallback=st.booleans(),
)


def test_every_policy_is_registered():
    assert set(NAMES) == {"off", "cap_tokens", "fallback"}


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=300, deadline=None)
@given(state=states, limit=limits)
def test_a_policy_acts_only_past_its_threshold_and_says_why(name, state, limit):
    """Conformance: a decision is the policy's own, has a known reason, and is taken only
    when the wait passed the threshold or the pool cannot serve; a cap lowers max_tokens."""
    decision = degradation_policy(name).decide(state, limit)
    if decision is None:
        return
    assert decision.action == name
    assert decision.reason in {QUEUE_WAIT, BREAKER_OPEN, NO_ENDPOINT}
    if decision.reason == QUEUE_WAIT:
        assert state.queue_wait_s >= limit.wait_s
    else:
        assert decision.reason == state.unavailable
    if decision.max_tokens:
        assert 0 < decision.max_tokens < limit.asked_tokens
    else:
        assert limit.has_fallback  # a move needs somewhere to go


@pytest.mark.parametrize("name", NAMES)
@given(limit=limits)
def test_a_calm_pool_is_never_degraded(name, limit):
    calm = PoolState(queue_wait_s=0.0)
    assert degradation_policy(name).decide(calm, limit) is None


def test_cap_tokens_caps_only_a_larger_request():
    policy = degradation_policy("cap_tokens")
    busy = PoolState(queue_wait_s=2.0)
    big = Limits(wait_s=1.0, max_tokens=16, asked_tokens=100, has_fallback=False)
    small = Limits(wait_s=1.0, max_tokens=16, asked_tokens=10, has_fallback=False)
    decision = policy.decide(busy, big)
    assert decision is not None
    assert (decision.reason, decision.max_tokens) == (QUEUE_WAIT, 16)
    assert policy.decide(busy, small) is None
    assert policy.decide(PoolState(queue_wait_s=0.5), big) is None


def test_fallback_moves_on_an_open_breaker_before_any_wait():
    policy = degradation_policy("fallback")
    limit = Limits(wait_s=10.0, max_tokens=16, asked_tokens=100, has_fallback=True)
    decision = policy.decide(PoolState(queue_wait_s=0.0, unavailable=BREAKER_OPEN), limit)
    assert decision is not None
    assert decision.reason == BREAKER_OPEN
    nowhere = Limits(wait_s=10.0, max_tokens=16, asked_tokens=100, has_fallback=False)
    assert policy.decide(PoolState(queue_wait_s=99.0, unavailable=NO_ENDPOINT), nowhere) is None


def test_settings_name_a_policy_per_class_with_a_default():
    parsed = DegradeSettings.from_policies(
        {"degrade": "fallback, batch:cap_tokens, interactive:off", "degrade_max_tokens": "64"}
    )
    assert parsed.policy_for("batch").name == "cap_tokens"
    assert parsed.policy_for("interactive").name == "off"
    assert parsed.policy_for("standard").name == "fallback"
    assert parsed.policy_for("").name == "fallback"
    assert parsed.max_tokens == 64
    assert parsed.wait_s(250) == 0.25  # the class's TTFT SLO
    assert parsed.wait_s(None) == 1.0
    fixed = DegradeSettings.from_policies({"degrade_wait_ms": "40"})
    assert fixed.wait_s(250) == 0.04
    assert DegradeSettings.from_policies({}).policy_for("x").name == "off"  # the default


@pytest.mark.parametrize(
    ("policies", "error", "says"),
    [
        ({"degrade": "shrink"}, UnknownPolicyError, "known: cap_tokens, fallback, off"),
        ({"degrade": "batch:off,batch:fallback"}, DegradeSettingsError, "batch twice"),
        ({"degrade": "off,fallback"}, DegradeSettingsError, "the default twice"),
        ({"degrade_wait_ms": "soon"}, DegradeSettingsError, "degrade_wait_ms"),
        ({"degrade_max_tokens": "0"}, DegradeSettingsError, "degrade_max_tokens"),
    ],
)
def test_bad_settings_are_refused_where_written(policies, error, says):
    with pytest.raises(error, match=says):
        DegradeSettings.from_policies(policies)
    assert any(says in e for e in pool_policy_errors(policies))


def test_good_settings_pass_the_pool_policy_check():
    assert pool_policy_errors({"degrade": "interactive:fallback", "degrade_wait_ms": "500"}) == []
