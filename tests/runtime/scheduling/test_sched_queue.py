"""PoolQueue behaviour: bands, bounds, expiry, shedding, cancellation, where a request stands."""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Mapping
from typing import ClassVar

import pytest
from schedsim import make_request

from runtime.scheduling.fairness import CounterState, VirtualTokenCounter
from runtime.scheduling.interfaces import QueuedRequest
from runtime.scheduling.ordering import ArrivalOrder, EarliestDeadlineFirst
from runtime.scheduling.queue import PoolQueue, QueueFull, shed_key

pytestmark = pytest.mark.unit


def new_queue(**kwargs) -> PoolQueue:
    return PoolQueue(fairness=VirtualTokenCounter(), ordering=EarliestDeadlineFirst(), **kwargs)


@pytest.fixture
def seq():
    return itertools.count()


def req(seq, tenant="a", band=0, inp=10, out=10, **kwargs) -> QueuedRequest:
    return make_request(
        seq, tenant=tenant, band=band, input_tokens=inp, output_tokens=out, **kwargs
    )


def test_queued_request_validates_and_estimates_cost(seq):
    r = req(seq, inp=10, out=20)
    assert r.cost == 50
    assert (
        QueuedRequest(
            id="x",
            tenant="a",
            band=0,
            class_name="c",
            input_tokens=10,
            max_output_tokens=100,
            seq=1,
            expected_output_tokens=5,
        ).cost
        == 20
    )
    with pytest.raises(ValueError, match="token counts"):
        req(seq, inp=-1)
    with pytest.raises(ValueError, match="weight"):
        req(seq, weight=0.0)
    with pytest.raises(ValueError, match="weight"):
        req(seq, weight=math.inf)
    with pytest.raises(ValueError, match="expected_output_tokens"):
        QueuedRequest(
            id="x",
            tenant="a",
            band=0,
            class_name="c",
            input_tokens=1,
            max_output_tokens=1,
            seq=1,
            expected_output_tokens=-1,
        )


def test_empty_queue_pops_none():
    queue = new_queue()
    assert queue.pop() is None
    assert len(queue) == 0
    assert queue.band_lengths() == {}


def test_strict_priority_without_shares(seq):
    queue = new_queue()
    batch = [req(seq, band=2) for _ in range(3)]
    standard = req(seq, band=1)
    urgent = req(seq, band=0)
    for r in [*batch, standard, urgent]:
        queue.push(r)
    assert queue.band_lengths() == {0: 1, 1: 1, 2: 3}
    assert [queue.pop() for _ in range(5)] == [urgent, standard, *batch]


def test_within_a_tenant_earliest_deadline_first_then_arrival(seq):
    queue = new_queue()
    late = req(seq, deadline=30.0)
    early = req(seq, deadline=10.0)
    none_a = req(seq)
    none_b = req(seq)
    for r in (none_a, late, early, none_b):
        queue.push(r)
    assert [queue.pop() for _ in range(4)] == [early, late, none_a, none_b]


def test_within_a_band_vtc_alternates_tenants_and_charges_input_at_dispatch(seq):
    queue = new_queue()
    for _ in range(3):
        queue.push(req(seq, tenant="a", inp=10, out=0))
    for _ in range(3):
        queue.push(req(seq, tenant="b", inp=10, out=0))
    tenants = [queue.pop().tenant for _ in range(6)]  # type: ignore[union-attr]
    assert tenants == ["a", "b", "a", "b", "a", "b"]
    assert queue.counter(0, "a") == queue.counter(0, "b") == 30
    assert queue.counter(7, "a") == 0.0


def test_output_is_charged_as_it_streams(seq):
    queue = new_queue()
    r = req(seq, inp=10, out=100, weight=2.0)
    queue.push(r)
    assert queue.pop() is r
    assert queue.counter(0, "a") == 5.0
    queue.charge_output(r, 10)
    assert queue.counter(0, "a") == 15.0
    with pytest.raises(KeyError, match="band 3"):
        queue.charge_output(req(seq, band=3), 1)


def test_band_bound_raises_queue_full_with_the_band(seq):
    queue = new_queue(max_len_per_band={1: 2}, default_max_len=3)
    queue.push(req(seq, band=1))
    queue.push(req(seq, band=1))
    with pytest.raises(QueueFull, match="band 1 is full") as full:
        queue.push(req(seq, band=1))
    assert (full.value.band, full.value.limit) == (1, 2)
    for _ in range(3):
        queue.push(req(seq, band=0))
    with pytest.raises(QueueFull) as full:
        queue.push(req(seq, band=0))
    assert (full.value.band, full.value.limit) == (0, 3)
    assert queue.limit(1) == 2
    assert queue.limit(5) == 3
    assert len(queue) == 5


@pytest.mark.parametrize(
    "kwargs",
    [{"max_len_per_band": {0: 0}}, {"default_max_len": 0}, {"max_total": -1}],
)
def test_bounds_must_be_positive(kwargs):
    with pytest.raises(ValueError, match="must be >= 1"):
        new_queue(**kwargs)


@pytest.mark.parametrize(
    ("shares", "message"),
    [
        ({1: 1.0}, r"\[0, 1\)"),
        ({1: -0.1}, r"\[0, 1\)"),
        ({1: math.nan}, r"\[0, 1\)"),
        ({1: 0.6, 2: 0.5}, "less than 1"),
    ],
)
def test_band_shares_are_validated(shares, message):
    with pytest.raises(ValueError, match=message):
        new_queue(band_min_shares=shares)


def test_duplicate_id_is_refused(seq):
    queue = new_queue()
    r = req(seq)
    queue.push(r)
    with pytest.raises(ValueError, match="already queued"):
        queue.push(r)


def test_remove_cancels_a_queued_request(seq):
    queue = new_queue()
    a1, a2, b1 = req(seq, tenant="a"), req(seq, tenant="a"), req(seq, tenant="b")
    for r in (a1, a2, b1):
        queue.push(r)
    assert queue.remove(a1.id) is a1
    assert queue.remove(a1.id) is None
    assert queue.remove("nope") is None
    assert a1.id not in queue
    assert queue.get(a2.id) is a2
    assert queue.get(a1.id) is None
    assert {queue.pop().id, queue.pop().id} == {a2.id, b1.id}  # type: ignore[union-attr]
    assert queue.pop() is None


def test_many_cancellations_keep_the_order(seq):
    queue = PoolQueue(fairness=VirtualTokenCounter(), ordering=ArrivalOrder())
    reqs = [req(seq) for _ in range(200)]
    for r in reqs:
        queue.push(r)
    kept = reqs[::10]
    for r in reqs:
        if r not in kept:
            assert queue.remove(r.id) is r
    assert [queue.pop() for _ in kept] == kept
    assert len(queue) == 0


def test_expire_drops_late_requests_before_dispatch(seq):
    queue = new_queue()
    soon = req(seq, deadline=5.0)
    later = req(seq, deadline=9.0)
    never = req(seq)
    popped = req(seq, deadline=1.0)
    queue.push(popped)
    assert queue.pop() is popped  # gone already: not expired again
    for r in (never, later, soon):
        queue.push(r)
    assert queue.expire(4.9) == []
    assert queue.expire(5.0) == [soon]
    assert queue.expire(100.0) == [later]
    assert len(queue) == 1
    assert queue.pop() is never


def test_expired_then_cancelled_is_not_returned_twice(seq):
    queue = new_queue()
    r = req(seq, deadline=5.0)
    queue.push(r)
    assert queue.remove(r.id) is r
    assert queue.expire(10.0) == []


def _classes(seq):
    """Issue's overload order: shadow -> batch -> over-quota -> standard -> interactive."""

    def make(name, band, shed_order, **kw):
        return req(seq, band=band, class_name=name, shed_order=shed_order, **kw)

    return {
        "interactive": make("interactive", 0, 2),
        "interactive_over": make("interactive", 0, 2, over_quota=True),
        "standard": make("standard", 1, 1),
        "standard_over": make("standard", 1, 1, over_quota=True),
        "batch": make("batch", 2, 0),
        "batch_over": make("batch", 2, 0, over_quota=True),
        "shadow": make("interactive", 0, 2, is_shadow=True),
    }


def test_shed_order(seq):
    queue = new_queue()
    classes = _classes(seq)
    for r in classes.values():
        queue.push(r)
    order = [
        "shadow",
        "batch_over",
        "batch",
        "standard_over",
        "standard",
        "interactive_over",
        "interactive",
    ]
    assert queue.shed_candidates(10) == [classes[name] for name in order]
    assert queue.shed_candidates(0) == []
    assert len(queue) == 7  # candidates are not removed
    assert queue.shed(2) == [classes["shadow"], classes["batch_over"]]
    assert len(queue) == 5


def test_newest_is_shed_first_among_equals(seq):
    queue = new_queue()
    old, new = req(seq), req(seq)
    queue.push(old)
    queue.push(new)
    assert queue.shed_candidates(1) == [new]
    assert shed_key(new) < shed_key(old)


def test_pool_bound_sheds_a_more_sheddable_request_to_make_room(seq):
    queue = new_queue(max_total=2)
    batch = req(seq, band=2, shed_order=0)
    standard = req(seq, band=1, shed_order=1)
    queue.push(batch)
    queue.push(standard)
    urgent = req(seq, band=0, shed_order=2)
    assert queue.push(urgent) == [batch]
    another_batch = req(seq, band=2, shed_order=0)
    with pytest.raises(QueueFull, match="pool queue is full") as full:
        queue.push(another_batch)
    assert full.value.band is None
    assert len(queue) == 2


def test_ahead_counts_higher_bands_own_earlier_requests_and_fair_share_of_others(seq):
    queue = new_queue()
    queue.push(req(seq, tenant="x", band=0, inp=100, out=0))  # more urgent: all ahead
    mine_first = req(seq, tenant="a", band=1, inp=10, out=0, deadline=5.0)
    mine_second = req(seq, tenant="a", band=1, inp=10, out=0, deadline=9.0)
    queue.push(mine_second)
    queue.push(mine_first)
    for _ in range(10):
        queue.push(req(seq, tenant="b", band=1, inp=10, out=0))  # 100 queued, same weight
    # mine_second: band 0 (1 request, 100) + mine_first (10) + b's equal share of a's 20.
    assert queue.ahead(mine_second).cost == 100 + 10 + 20
    assert queue.position(mine_second.id) == 1 + 1 + 2 + 1
    assert queue.ahead(mine_first).cost == 100 + 10
    assert queue.position(mine_first.id) == 1 + 1 + 1
    # Not queued yet, weight 0.5: the others get twice its service while it is served.
    light = req(seq, tenant="c", band=1, inp=10, out=0, weight=0.5)
    assert queue.ahead(light).cost == 100 + 20 + 20
    assert queue.ahead(light).requests == 1 + 2 + 2
    # A less urgent band waits for everything above it.
    assert queue.work_ahead(req(seq, band=5)) == 100 + 20 + 100
    assert queue.ahead(req(seq, band=5)).requests == 13
    with pytest.raises(KeyError, match="not queued"):
        queue.position("nope")


def test_stats_report_length_cost_and_oldest_arrival(seq):
    queue = new_queue()
    queue.push(req(seq, band=1, inp=5, out=5, arrived_at=3.0))
    queue.push(req(seq, band=1, tenant="b", inp=1, out=0, arrived_at=1.0))
    first = req(seq, band=0, arrived_at=2.0)
    queue.push(first)
    assert queue.pop() is first
    stats = queue.stats()
    assert stats[1].length == 2
    assert stats[1].cost == 16
    assert stats[1].oldest_arrival == 1.0
    assert stats[0].length == 0
    assert stats[0].cost == 0.0
    assert stats[0].oldest_arrival is None
    assert queue.backlogged(1) == {"a", "b"}
    assert queue.backlogged(0) == frozenset()
    assert queue.backlogged(9) == frozenset()


class _Rogue:
    """A broken fairness policy: picks a tenant that is not backlogged."""

    name: ClassVar[str] = "rogue"

    def new_state(self) -> CounterState:
        return CounterState()

    def on_backlogged(self, state: CounterState, tenant: str, active: Collection[str]) -> None:
        return

    def pick(self, state: CounterState, heads: Mapping[str, QueuedRequest]) -> str:
        return "ghost"

    def charge(self, state, tenant, *, weight, input_tokens=0, output_tokens=0) -> None:
        return

    def counter(self, state: CounterState, tenant: str) -> float:
        return 0.0


def test_a_policy_picking_a_non_backlogged_tenant_is_a_clear_error(seq):
    queue = PoolQueue(fairness=_Rogue(), ordering=ArrivalOrder())
    queue.push(req(seq))
    with pytest.raises(RuntimeError, match="'rogue' picked 'ghost'"):
        queue.pop()
