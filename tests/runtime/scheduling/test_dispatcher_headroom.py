"""The headroom rule: who is gated, and how many slots the gated tenants may hold."""

from __future__ import annotations

import pytest

from runtime.scheduling.headroom import OPEN, Gate, HeadroomRule

pytestmark = pytest.mark.unit


def rule(fraction: float = 0.25) -> HeadroomRule:
    r = HeadroomRule(fraction=fraction, window_s=10.0)
    for tenant in ("flood", "light", "idle"):
        r.note(tenant, 1.0, now=0.0)
    return r


def test_a_tenant_past_its_share_is_gated_below_the_reserve() -> None:
    r = rule()
    gate = r.gate(inflight={"flood": 6}, queued={"flood": 30}, capacity=12, now=1.0)
    # shares: 4 each; light and idle are under (demand 0): reserve max(0, floor(12 / 4)) = 3.
    assert gate == Gate(frozenset({"flood"}), 9)


def test_the_reserve_follows_the_under_tenants_peak_demand_within_the_window() -> None:
    r = rule()
    r.gate(inflight={"light": 3, "idle": 2}, queued={"light": 1}, capacity=12, now=1.0)
    gate = r.gate(inflight={"flood": 6}, queued={}, capacity=12, now=2.0)
    assert gate.limit == 12 - 6  # the under tenants' peak demand
    r.note("light", 1.0, now=11.5)
    r.note("idle", 1.0, now=11.5)
    r.note("flood", 1.0, now=11.5)
    later = r.gate(inflight={"flood": 6}, queued={}, capacity=12, now=12.0)
    assert later.limit == 12 - 3  # the peak left the window: back to the minimum


def test_the_reserve_never_takes_more_than_the_under_tenants_shares() -> None:
    r = HeadroomRule(fraction=0.9, window_s=10.0)
    r.note("flood", 1.0, now=0.0)
    r.note("light", 1.0, now=0.0)
    gate = r.gate(inflight={"flood": 5}, queued={}, capacity=8, now=1.0)
    assert gate.limit == 4  # floor(8 * 0.9) = 7 capped at light's share of 4


@pytest.mark.parametrize(
    ("inflight", "capacity", "fraction"),
    [
        ({"flood": 2, "light": 2, "idle": 2}, 6, 0.25),  # nobody under its share
        ({}, 6, 0.25),  # nobody over
        ({"flood": 9}, 12, 0.0),  # headroom off (fcfs)
        ({"flood": 9}, 0, 0.25),  # no usable endpoint
    ],
)
def test_open_gates(inflight: dict[str, int], capacity: int, fraction: float) -> None:
    assert rule(fraction).gate(inflight=inflight, queued={}, capacity=capacity, now=1.0) is OPEN


def test_a_lone_tenant_is_never_gated_and_idle_tenants_are_forgotten() -> None:
    r = HeadroomRule(fraction=0.25, window_s=10.0)
    r.note("flood", 1.0, now=0.0)
    r.note("gone", 1.0, now=0.0)
    assert r.gate(inflight={"flood": 8}, queued={}, capacity=8, now=1.0)
    r.note("flood", 1.0, now=20.0)
    assert r.gate(inflight={"flood": 8}, queued={}, capacity=8, now=20.5) is OPEN


def test_weights_set_the_shares() -> None:
    r = HeadroomRule(fraction=0.25, window_s=10.0)
    r.note("big", 3.0, now=0.0)
    r.note("small", 1.0, now=0.0)
    assert r.gate(inflight={"big": 6}, queued={}, capacity=8, now=1.0) is OPEN  # its share
    assert r.gate(inflight={"big": 7}, queued={}, capacity=8, now=1.0) == Gate(
        frozenset({"big"}), 6
    )


def test_a_tenant_holding_exactly_its_share_is_not_gated_with_one_past_it() -> None:
    r = rule()
    gate = r.gate(inflight={"flood": 6, "light": 4}, queued={"light": 1}, capacity=12, now=1.0)
    # shares 4: light holds its share and wants one more; only flood is past its share.
    # The reserve holds light's demand (capped at its share) and the fraction's 3 slots.
    assert gate == Gate(frozenset({"flood"}), 8)


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="fraction"):
        HeadroomRule(fraction=1.0)
    with pytest.raises(ValueError, match="window_s"):
        HeadroomRule(fraction=0.1, window_s=0)
