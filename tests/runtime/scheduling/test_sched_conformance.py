"""One conformance suite per interface, run against every registered implementation."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from schedsim import make_request

from runtime.scheduling.interfaces import EndpointLoad, QueuedRequest
from runtime.scheduling.queue import PoolQueue, QueueFull
from runtime.scheduling.registry import (
    fairness_policy,
    names,
    ordering_policy,
    saturation_detector,
)

pytestmark = pytest.mark.unit

FAIRNESS = names("fairness")
ORDERING = names("ordering")
SATURATION = names("saturation")
TENANTS = "abcd"


def test_every_interface_has_its_implementations_registered():
    assert set(FAIRNESS) == {"vtc", "fcfs", "round_robin"}
    assert set(ORDERING) == {"edf", "fcfs"}
    assert set(SATURATION) == {"vllm_metrics", "inflight_only"}


# -- FairnessPolicy ---------------------------------------------------------------------------

fairness_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("backlogged"), st.sampled_from(TENANTS), st.sets(st.sampled_from(TENANTS))
        ),
        st.tuples(
            st.just("charge"),
            st.sampled_from(TENANTS),
            st.integers(0, 500),
            st.integers(0, 500),
            st.sampled_from([0.5, 1.0, 2.0, 3.0]),
        ),
        st.tuples(st.just("pick"), st.sets(st.sampled_from(TENANTS), min_size=1)),
    ),
    max_size=60,
)


@pytest.mark.parametrize("name", FAIRNESS)
@settings(max_examples=200, deadline=None)
@given(ops=fairness_ops)
def test_fairness_picks_a_backlogged_tenant_and_counters_never_fall(name, ops):
    policy = fairness_policy(name)
    state = policy.new_state()
    seq = itertools.count()
    before = {t: policy.counter(state, t) for t in TENANTS}
    for op in ops:
        if op[0] == "backlogged":
            policy.on_backlogged(state, op[1], op[2] - {op[1]})
        elif op[0] == "charge":
            _, tenant, inp, out, weight = op
            policy.charge(state, tenant, weight=weight, input_tokens=inp, output_tokens=out)
            expected = before[tenant] + (inp + 2 * out) / weight
            assert policy.counter(state, tenant) == pytest.approx(expected)
        else:
            heads = {
                t: make_request(seq, tenant=t, input_tokens=1, output_tokens=1)
                for t in sorted(op[1])
            }
            assert policy.pick(state, heads) in heads
        after = {t: policy.counter(state, t) for t in TENANTS}
        assert all(after[t] >= before[t] for t in TENANTS)
        before = after


@pytest.mark.parametrize("name", FAIRNESS)
def test_fairness_rejects_bad_charges_and_empty_picks(name):
    policy = fairness_policy(name)
    state = policy.new_state()
    with pytest.raises(ValueError, match="weight must be > 0"):
        policy.charge(state, "a", weight=0.0, input_tokens=1)
    with pytest.raises(ValueError, match="negative"):
        policy.charge(state, "a", weight=1.0, output_tokens=-1)
    with pytest.raises(ValueError, match="at least one backlogged tenant"):
        policy.pick(state, {})
    assert policy.counter(state, "a") == 0.0


@pytest.mark.parametrize("name", FAIRNESS)
def test_fairness_serves_every_backlogged_tenant_eventually(name):
    """No policy starves a tenant that stays backlogged (equal weights, equal requests)."""
    policy = fairness_policy(name)
    state = policy.new_state()
    seq = itertools.count()
    heads = {}
    for tenant in TENANTS:
        policy.on_backlogged(state, tenant, list(heads))
        heads[tenant] = make_request(seq, tenant=tenant, input_tokens=5, output_tokens=5)
    served = []
    for _ in range(4 * len(TENANTS)):
        tenant = policy.pick(state, heads)
        served.append(tenant)
        policy.charge(state, tenant, weight=1.0, input_tokens=5, output_tokens=5)
        heads[tenant] = make_request(seq, tenant=tenant, input_tokens=5, output_tokens=5)
    assert set(served) == set(TENANTS)


# -- OrderingPolicy ---------------------------------------------------------------------------

requests_st = st.builds(
    lambda seq, deadline: QueuedRequest(
        id=f"r{seq}",
        tenant="t",
        band=0,
        class_name="c",
        input_tokens=1,
        max_output_tokens=1,
        seq=seq,
        deadline=deadline,
    ),
    seq=st.integers(0, 5),
    deadline=st.sampled_from([1.0, 2.0, 3.0, math.inf]),
)


@pytest.mark.parametrize("name", ORDERING)
@settings(max_examples=200, deadline=None)
@given(a=requests_st, b=requests_st, c=requests_st)
def test_ordering_is_a_strict_weak_order(name, a, b, c):
    less = ordering_policy(name).less
    assert not less(a, a)  # irreflexive
    if less(a, b):
        assert not less(b, a)  # asymmetric
    if less(a, b) and less(b, c):
        assert less(a, c)  # transitive
    incomparable = lambda x, y: not less(x, y) and not less(y, x)  # noqa: E731
    if incomparable(a, b) and incomparable(b, c):
        assert incomparable(a, c)  # incomparability is transitive


# -- SaturationDetector -----------------------------------------------------------------------

loads = st.builds(
    EndpointLoad,
    kv_usage=st.one_of(st.none(), st.floats(0, 1)),
    waiting=st.one_of(st.none(), st.integers(0, 5).map(float)),
    age_s=st.one_of(st.none(), st.floats(0, 5)),
)


@pytest.mark.parametrize("name", SATURATION)
@settings(max_examples=200, deadline=None)
@given(inflight=st.integers(0, 20), capacity=st.integers(0, 20), metrics=loads)
def test_saturation_never_exceeds_capacity_and_is_monotone(name, inflight, capacity, metrics):
    detector = saturation_detector(name)
    room = detector.has_room(inflight=inflight, capacity=capacity, metrics=metrics)
    if inflight >= capacity:
        assert not room
    if room and inflight > 0:  # fewer requests in flight never takes room away
        assert detector.has_room(inflight=inflight - 1, capacity=capacity, metrics=metrics)
    # Without engine metrics, the router's in-flight count alone decides.
    unknown = detector.has_room(inflight=inflight, capacity=capacity, metrics=EndpointLoad())
    assert unknown == (inflight < capacity)


# -- PoolQueue with every fairness x ordering -------------------------------------------------

queue_ops = st.lists(
    st.one_of(
        st.tuples(
            st.just("push"),
            st.sampled_from(TENANTS),
            st.integers(0, 2),
            st.integers(1, 50),
            st.integers(1, 50),
            st.sampled_from([5.0, 10.0, 20.0, math.inf]),
        ),
        st.tuples(st.just("pop")),
        st.tuples(st.just("remove"), st.integers(0, 60)),
        st.tuples(st.just("expire"), st.sampled_from([0.0, 6.0, 12.0])),
        st.tuples(st.just("shed"), st.integers(0, 3)),
        st.tuples(st.just("output"), st.integers(0, 40)),
    ),
    max_size=80,
)


@pytest.mark.parametrize("ordering", ORDERING)
@pytest.mark.parametrize("fairness", FAIRNESS)
@settings(max_examples=100, deadline=None)
@given(ops=queue_ops)
def test_queue_never_loses_or_duplicates_requests(fairness, ordering, ops):
    limits = {0: 6, 1: 4}
    queue = PoolQueue(
        fairness=fairness_policy(fairness),
        ordering=ordering_policy(ordering),
        band_min_shares={1: 0.1, 2: 0.1},
        max_len_per_band=limits,
        default_max_len=8,
    )
    less = ordering_policy(ordering).less
    seq = itertools.count()
    queued: dict[str, QueuedRequest] = {}
    out: list[str] = []
    dispatched: list[QueuedRequest] = []
    pushed = 0
    for op in ops:
        kind = op[0]
        if kind == "push":
            _, tenant, band, inp, out_tokens, deadline = op
            req = make_request(
                seq,
                tenant=tenant,
                band=band,
                input_tokens=inp,
                output_tokens=out_tokens,
                deadline=deadline,
            )
            in_band = sum(1 for r in queued.values() if r.band == band)
            if in_band >= limits.get(band, 8):
                with pytest.raises(QueueFull) as full:
                    queue.push(req)
                assert full.value.band == band
                continue
            assert queue.push(req) == []
            queued[req.id] = req
            pushed += 1
            with pytest.raises(ValueError, match="already queued"):
                queue.push(req)
        elif kind == "pop":
            req = queue.pop()
            if not queued:
                assert req is None
                continue
            assert req is not None
            assert queued.pop(req.id) is req
            same = [r for r in queued.values() if r.tenant == req.tenant and r.band == req.band]
            assert not any(less(r, req) for r in same)  # the tenant's first by ordering
            out.append(req.id)
            dispatched.append(req)
        elif kind == "remove":
            req_id = f"r{op[1]}"
            got = queue.remove(req_id)
            assert (got is not None) == (req_id in queued)
            if got is not None:
                assert queued.pop(req_id) is got
                out.append(req_id)
        elif kind == "expire":
            expired = queue.expire(op[1])
            assert {r.id for r in expired} == {i for i, r in queued.items() if r.deadline <= op[1]}
            for r in expired:
                del queued[r.id]
                out.append(r.id)
        elif kind == "shed":
            victims = queue.shed(op[1])
            assert len(victims) == min(op[1], len(queued))
            for r in victims:
                del queued[r.id]
                out.append(r.id)
        elif dispatched:
            queue.charge_output(dispatched[-1], op[1])
        assert len(queue) == len(queued)
        assert all(req_id in queue for req_id in queued)
        lengths = queue.band_lengths()
        assert sum(lengths.values()) == len(queued)
        for band, length in lengths.items():
            assert length == sum(1 for r in queued.values() if r.band == band)
            assert length <= limits.get(band, 8)
    while (req := queue.pop()) is not None:
        out.append(req.id)
    assert len(queue) == 0
    assert len(out) == len(set(out)) == pushed
