"""Each fairness policy, ordering policy and saturation detector on its own."""

from __future__ import annotations

import itertools

import pytest
from schedsim import make_request

from runtime.scheduling.fairness import FirstComeFirstServed, RoundRobin, VirtualTokenCounter
from runtime.scheduling.interfaces import EndpointLoad
from runtime.scheduling.ordering import ArrivalOrder, EarliestDeadlineFirst
from runtime.scheduling.saturation import InflightOnly, VllmMetrics

pytestmark = pytest.mark.unit


@pytest.fixture
def seq():
    return itertools.count()


def heads(seq, *tenants, **deadlines):
    return {
        t: make_request(
            seq, tenant=t, input_tokens=1, output_tokens=1, deadline=deadlines.get(t, float("inf"))
        )
        for t in tenants
    }


# -- VTC ------------------------------------------------------------------------------------


def test_vtc_serves_the_smallest_counter_ties_to_the_oldest_head(seq):
    vtc = VirtualTokenCounter()
    state = vtc.new_state()
    h = heads(seq, "b", "a")  # b's head is older
    assert vtc.pick(state, h) == "b"
    vtc.charge(state, "b", weight=1.0, input_tokens=5)
    assert vtc.pick(state, h) == "a"


def test_vtc_charges_weighted_tokens_output_double():
    vtc = VirtualTokenCounter()
    state = vtc.new_state()
    vtc.charge(state, "a", weight=2.0, input_tokens=10, output_tokens=5)
    assert vtc.counter(state, "a") == (10 + 2 * 5) / 2


def test_vtc_lifts_a_newly_backlogged_tenant_to_the_minimum_active_counter():
    vtc = VirtualTokenCounter()
    state = vtc.new_state()
    vtc.charge(state, "a", weight=1.0, input_tokens=100)
    vtc.charge(state, "b", weight=1.0, input_tokens=60)
    vtc.on_backlogged(state, "c", ["a", "b"])
    assert vtc.counter(state, "c") == 60
    # Lifting never lowers a counter.
    vtc.charge(state, "d", weight=1.0, input_tokens=500)
    vtc.on_backlogged(state, "d", ["a", "b"])
    assert vtc.counter(state, "d") == 500


def test_vtc_allowance_lets_a_returning_tenant_bank_a_little():
    vtc = VirtualTokenCounter(allowance=15.0)
    state = vtc.new_state()
    vtc.charge(state, "a", weight=1.0, input_tokens=100)
    vtc.on_backlogged(state, "c", ["a"])
    assert vtc.counter(state, "c") == 85
    with pytest.raises(ValueError, match="allowance"):
        VirtualTokenCounter(allowance=-1.0)


def test_vtc_tenant_returning_to_an_idle_band_is_lifted_to_the_last_served(seq):
    vtc = VirtualTokenCounter()
    state = vtc.new_state()
    vtc.on_backlogged(state, "a", [])  # nothing served yet: no lift
    assert vtc.counter(state, "a") == 0
    assert vtc.pick(state, heads(seq, "a")) == "a"
    vtc.charge(state, "a", weight=1.0, input_tokens=1000)
    vtc.on_backlogged(state, "b", [])  # band idle again; a was served last
    assert vtc.counter(state, "b") == 1000


# -- baselines ------------------------------------------------------------------------------


def test_fcfs_picks_the_oldest_head_regardless_of_service(seq):
    fcfs = FirstComeFirstServed()
    state = fcfs.new_state()
    h = heads(seq, "a", "b")
    fcfs.charge(state, "a", weight=1.0, input_tokens=10_000)
    assert fcfs.pick(state, h) == "a"
    assert fcfs.counter(state, "a") == 10_000


def test_round_robin_takes_turns_and_skips_idle_tenants(seq):
    rr = RoundRobin()
    state = rr.new_state()
    for t in "abc":
        rr.on_backlogged(state, t, [])
    order = [rr.pick(state, heads(seq, "a", "b", "c")) for _ in range(4)]
    assert order == ["a", "b", "c", "a"]
    assert rr.pick(state, heads(seq, "a", "c")) == "c"  # b idle: skipped
    assert rr.pick(state, heads(seq, "a", "b", "c", "d")) == "d"  # d joins the ring's end
    assert rr.pick(state, heads(seq, "a", "b", "c", "d")) == "a"


def test_orderings():
    seq = itertools.count()
    late = make_request(seq, tenant="a", input_tokens=1, output_tokens=1, deadline=20.0)
    early = make_request(seq, tenant="a", input_tokens=1, output_tokens=1, deadline=10.0)
    assert EarliestDeadlineFirst().less(early, late)
    assert not EarliestDeadlineFirst().less(late, early)
    assert ArrivalOrder().less(late, early)


# -- saturation -----------------------------------------------------------------------------

FRESH = 0.1


@pytest.mark.parametrize(
    ("inflight", "metrics", "room"),
    [
        (3, EndpointLoad(kv_usage=0.5, waiting=0, age_s=FRESH), True),
        (4, EndpointLoad(kv_usage=0.5, waiting=0, age_s=FRESH), False),  # at capacity
        (3, EndpointLoad(kv_usage=0.9, waiting=0, age_s=FRESH), False),  # KV at threshold
        (3, EndpointLoad(kv_usage=0.89, waiting=0, age_s=FRESH), True),
        (3, EndpointLoad(kv_usage=0.1, waiting=1, age_s=FRESH), False),  # engine queues
        (3, EndpointLoad(kv_usage=0.99, waiting=5, age_s=2.0), True),  # stale: in-flight only
        (3, EndpointLoad(kv_usage=None, waiting=None, age_s=FRESH), True),  # not exported
        (3, EndpointLoad(), True),  # never scraped
    ],
)
def test_vllm_metrics_detector(inflight, metrics, room):
    assert VllmMetrics().has_room(inflight=inflight, capacity=4, metrics=metrics) is room


def test_vllm_metrics_settings():
    strict = VllmMetrics(kv_threshold=0.5, stale_after_s=5.0)
    load = EndpointLoad(kv_usage=0.6, waiting=0, age_s=2.0)
    assert not strict.has_room(inflight=0, capacity=1, metrics=load)
    with pytest.raises(ValueError, match="kv_threshold"):
        VllmMetrics(kv_threshold=0)
    with pytest.raises(ValueError, match="stale_after_s"):
        VllmMetrics(stale_after_s=0)


def test_inflight_only_ignores_engine_metrics():
    full = EndpointLoad(kv_usage=1.0, waiting=10, age_s=0.0)
    assert InflightOnly().has_room(inflight=1, capacity=2, metrics=full)
    assert not InflightOnly().has_room(inflight=2, capacity=2, metrics=EndpointLoad())
