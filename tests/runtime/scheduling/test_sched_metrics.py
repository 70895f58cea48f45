"""Fairness measures: entitled versus served share, Jain's index, max service gap."""

from __future__ import annotations

import pytest

from runtime.scheduling.metrics import (
    TenantShare,
    jain_fairness,
    jain_index,
    max_service_gap,
    normalized,
    shares,
)

pytestmark = pytest.mark.unit


def test_jain_index_bounds():
    assert jain_index([5, 5, 5, 5]) == 1.0
    assert jain_index([10, 0, 0, 0]) == pytest.approx(0.25)
    assert jain_index([]) == 1.0
    assert jain_index([0, 0]) == 1.0
    assert 0.25 < jain_index([4, 3, 2, 1]) < 1


def test_weighted_fairness_normalizes_by_weight():
    served = {"a": 200.0, "b": 100.0}
    weights = {"a": 2.0, "b": 1.0}
    assert normalized(served, weights) == {"a": 100.0, "b": 100.0}
    assert jain_fairness(served, weights) == 1.0
    assert max_service_gap(served, weights) == 0.0
    assert max_service_gap({"a": 50.0, "b": 100.0}, {"a": 1.0, "b": 1.0}) == 50.0
    assert max_service_gap({"a": 50.0}, {"a": 1.0}) == 0.0


def test_shares_compare_served_with_entitled():
    report = shares({"a": 300.0, "b": 100.0}, {"a": 1.0, "b": 1.0, "idle": 5.0})
    assert report == [
        TenantShare(tenant="a", served=300.0, share=0.75, entitled=0.5),
        TenantShare(tenant="b", served=100.0, share=0.25, entitled=0.5),
    ]
    assert report[0].ratio == 1.5
    assert shares({"a": 0.0}, {"a": 1.0})[0].share == 0.0
    assert TenantShare(tenant="x", served=1.0, share=0.5, entitled=0.0).ratio == float("inf")
    assert TenantShare(tenant="x", served=0.0, share=0.0, entitled=0.0).ratio == 1.0


def test_missing_or_bad_weights_are_errors():
    with pytest.raises(ValueError, match="no weight for tenant"):
        shares({"a": 1.0}, {})
    with pytest.raises(ValueError, match="weights must be > 0"):
        jain_fairness({"a": 1.0}, {"a": 0.0})
