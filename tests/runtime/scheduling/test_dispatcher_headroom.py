"""The headroom rule: who is gated, and how many slots the gated tenants may hold."""

from __future__ import annotations

import math

import pytest

from runtime.scheduling.headroom import (
    BURST_CAP,
    BURST_GAIN,
    DEMAND_TIME,
    FLOOD_DEMAND,
    OPEN,
    PEAK_MEMORY,
    Gate,
    HeadroomRule,
)

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


def test_the_reserve_follows_the_under_tenants_recent_peak_demand() -> None:
    r = rule()
    r.gate(inflight={"light": 3, "idle": 2}, queued={"light": 1}, capacity=12, now=1.0)
    gate = r.gate(inflight={"flood": 6}, queued={}, capacity=12, now=2.0)
    assert gate.limit == 12 - 6  # the under tenants' peak demand
    memory = 10.0 * PEAK_MEMORY

    def later(now: float) -> Gate:
        for tenant in ("light", "idle", "flood"):
            r.note(tenant, 1.0, now=now - 0.5)
        return r.gate(inflight={"flood": 6}, queued={}, capacity=12, now=now)

    assert later(1.0 + memory + 1).limit == 12 - 6  # still remembered
    assert later(1.0 + 2 * memory + 1).limit == 12 - 3  # forgotten: back to the minimum


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


def two() -> HeadroomRule:
    r = HeadroomRule(fraction=0.25, window_s=10.0)
    for tenant in ("flood", "light"):
        r.note(tenant, 1.0, now=0.0)
    return r


def test_a_tenant_that_used_less_than_its_share_may_burst_past_it_within_its_credit() -> None:
    r = two()  # capacity 16: shares 8
    r.gate(inflight={"flood": 8, "light": 5}, queued={}, capacity=16, now=0.0)
    for tenant in ("flood", "light"):
        r.note(tenant, 1.0, now=10.0)
    # light held 5 for one time constant: usage 5 + 3/e = 6.10, credit min(8 * BURST_CAP,
    # BURST_GAIN * 1.90) slots.
    credit = min(8 * BURST_CAP, BURST_GAIN * (8 - (5 + 3 / math.e)))
    allowed = math.floor(8 + credit)
    queued = {"flood": 40, "light": 3}
    within = {"flood": 16 - allowed, "light": allowed}
    assert r.gate(inflight=within, queued=queued, capacity=16, now=10.0) is OPEN
    # Past its share and its credit it is over, and flood (at its share on average) is kept
    # its demand, up to its share.
    past = r.gate(inflight={"flood": 0, "light": allowed + 1}, queued=queued, capacity=16, now=10.0)
    assert past == Gate(frozenset({"light"}), 8)


def test_a_fresh_tenant_has_no_credit() -> None:
    r = rule()
    gate = r.gate(inflight={"flood": 5}, queued={"flood": 40}, capacity=12, now=1.0)
    assert gate.tenants == frozenset({"flood"})  # first seen: usage = share, credit 0


def test_no_room_is_kept_for_a_tenant_above_its_share_on_average() -> None:
    r = two()
    r.gate(inflight={"flood": 10, "light": 6}, queued={"flood": 2}, capacity=16, now=0.0)
    for tenant in ("flood", "light"):
        r.note(tenant, 1.0, now=20.0)
    # After two time constants: flood's usage 10 - 2/e^2 = 9.73, above its share of 8; light's
    # 6 + 2/e^2 = 6.27. Light past share + credit (at most half a share) is over, and flood,
    # squeezed under its share with a queue (not flooding: it asks for 12 < 2 shares), is kept
    # no room: only the fraction's floor.
    gate = r.gate(inflight={"flood": 0, "light": 17}, queued={"flood": 6}, capacity=16, now=20.0)
    assert gate == Gate(frozenset({"light"}), 16 - 4)


def flooding(light_peak: int) -> tuple[HeadroomRule, Gate]:
    """Flood asks for 56 slots (7 shares) from t=0 and light peaks at ``light_peak`` then;
    the gate ten seconds later."""
    r = two()  # capacity 16: shares 8
    r.gate(inflight={"flood": 6, "light": 6}, queued={"flood": 50, "light": light_peak - 6},
           capacity=16, now=0.0)  # fmt: skip
    for tenant in ("flood", "light"):
        r.note(tenant, 1.0, now=10.0)
    # flood's demand: 56 - 48 e^(-10 / (10 DEMAND_TIME)) > FLOOD_DEMAND shares.
    assert 56 - 48 * math.exp(-1 / DEMAND_TIME) > FLOOD_DEMAND * 8
    return r, r.gate(inflight={"flood": 6, "light": 1}, queued={"flood": 50}, capacity=16,
                     now=10.0)  # fmt: skip


def test_a_tenant_asking_for_more_than_twice_its_share_gets_what_the_others_peak_left() -> None:
    _, gate = flooding(light_peak=10)
    assert gate.flooders == frozenset({"flood"})
    assert gate.flood_limit == 16 - 10  # light's peak, though it holds one slot now
    assert "flood" in gate.tenants  # it yields to the others too
    assert gate.blocks("flood", {"flood": 6, "light": 1})
    assert not gate.blocks("flood", {"flood": 5, "light": 1})
    assert not gate.blocks("light", {"flood": 6, "light": 9})


def test_a_flooder_keeps_a_quarter_of_its_share_and_is_let_go_when_the_peak_is_forgotten() -> None:
    r, gate = flooding(light_peak=16)
    assert gate.flood_limit == 2  # the floor: a quarter of its share of 8
    memory = 10.0 * PEAK_MEMORY
    now = 10.0
    while now < 2 * memory + 1:  # light stays active with one slot held; flood keeps asking
        now += 5.0
        for tenant in ("flood", "light"):
            r.note(tenant, 1.0, now=now)
        gate = r.gate(inflight={"flood": 2, "light": 1}, queued={"flood": 50}, capacity=16,
                      now=now)  # fmt: skip
    assert gate.flooders == frozenset({"flood"})
    assert gate.flood_limit == 16 - 1  # light's peak is now the one slot it holds


def test_a_burst_is_not_a_flood() -> None:
    r = two()  # capacity 16: shares 8
    # light asks for three shares at once, for a second; its demand averages 24 - 16 e^-0.2.
    first = r.gate(inflight={"flood": 4, "light": 8}, queued={"light": 16}, capacity=16, now=0.0)
    assert first.flooders == frozenset()
    for tenant in ("flood", "light"):
        r.note(tenant, 1.0, now=1.0)
    gate = r.gate(inflight={"flood": 4, "light": 12}, queued={"light": 4}, capacity=16, now=1.0)
    assert gate.flooders == frozenset()


def test_a_lone_flooder_is_not_held() -> None:
    r = HeadroomRule(fraction=0.25, window_s=10.0)
    r.note("flood", 1.0, now=0.0)
    r.gate(inflight={"flood": 8}, queued={"flood": 100}, capacity=8, now=0.0)
    r.note("flood", 1.0, now=10.0)
    assert r.gate(inflight={"flood": 8}, queued={"flood": 100}, capacity=8, now=10.0) is OPEN


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="fraction"):
        HeadroomRule(fraction=1.0)
    with pytest.raises(ValueError, match="window_s"):
        HeadroomRule(fraction=0.1, window_s=0)
