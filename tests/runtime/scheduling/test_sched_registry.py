"""Policies are looked up by name from one immutable registry per interface."""

from __future__ import annotations

import pytest

from runtime.scheduling.fairness import FirstComeFirstServed, VirtualTokenCounter
from runtime.scheduling.ordering import ArrivalOrder, EarliestDeadlineFirst
from runtime.scheduling.registry import (
    PoolPolicies,
    UnknownPolicyError,
    fairness_policy,
    names,
    ordering_policy,
    registry,
    saturation_detector,
)
from runtime.scheduling.saturation import InflightOnly, VllmMetrics

pytestmark = pytest.mark.unit


def test_names_are_sorted_per_interface():
    assert names("fairness") == ("fcfs", "round_robin", "vtc")
    assert names("ordering") == ("edf", "fcfs")
    assert names("saturation") == ("inflight_only", "vllm_metrics")


def test_lookup_returns_fresh_instances():
    assert isinstance(fairness_policy("vtc"), VirtualTokenCounter)
    assert isinstance(fairness_policy(" fcfs "), FirstComeFirstServed)
    assert fairness_policy("vtc") is not fairness_policy("vtc")
    assert isinstance(ordering_policy("edf"), EarliestDeadlineFirst)
    assert isinstance(saturation_detector("inflight_only"), InflightOnly)


@pytest.mark.parametrize(
    ("lookup", "message"),
    [
        (fairness_policy, r"unknown fairness policy 'wfq' \(known: fcfs, round_robin, vtc\)"),
        (ordering_policy, r"unknown ordering policy 'wfq' \(known: edf, fcfs\)"),
        (
            saturation_detector,
            r"unknown saturation policy 'wfq' \(known: inflight_only, vllm_metrics\)",
        ),
    ],
)
def test_unknown_names_list_the_known_ones(lookup, message):
    with pytest.raises(UnknownPolicyError, match=message):
        lookup("wfq")


def test_unknown_interface_is_an_error():
    with pytest.raises(UnknownPolicyError, match="known: fairness, ordering, saturation"):
        registry("batching")  # type: ignore[arg-type]


def test_registry_is_read_only():
    table = registry("fairness")
    with pytest.raises(TypeError):
        table["mine"] = VirtualTokenCounter  # type: ignore[index]
    assert "mine" not in registry("fairness")


def test_pool_policies_default_and_override():
    default = PoolPolicies.from_policies({})
    assert isinstance(default.fairness, VirtualTokenCounter)
    assert isinstance(default.ordering, EarliestDeadlineFirst)
    assert isinstance(default.saturation, VllmMetrics)
    chosen = PoolPolicies.from_policies(
        {
            "fairness": "fcfs",
            "ordering": "fcfs",
            "saturation": "inflight_only",
            "picker": "max_score",
        }  # routing's keys are not ours: ignored
    )
    assert isinstance(chosen.fairness, FirstComeFirstServed)
    assert isinstance(chosen.ordering, ArrivalOrder)
    assert isinstance(chosen.saturation, InflightOnly)
    with pytest.raises(UnknownPolicyError, match="unknown fairness policy 'drr'"):
        PoolPolicies.from_policies({"fairness": "drr"})
