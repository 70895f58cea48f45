"""Conformance of every registered scaling policy, and the controller's timing rules."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.policy_names import UnknownPolicyError
from runtime.scaling.controller import Bounds, Cooldowns, History, decide
from runtime.scaling.policies import ScalingTarget
from runtime.scaling.registry import names, policy_for_tier, scaling_policy
from runtime.scaling.signals import PoolSignals, aggregate

pytestmark = pytest.mark.unit

POLICIES = names()
TARGET = ScalingTarget(low=0.4, high=0.8, wait_slo_s=1.0)


def sig(**kw: object) -> PoolSignals:
    return PoolSignals(pool="p", at=1.0, **kw)  # type: ignore[arg-type]


def test_both_policies_are_registered_and_unknown_names_are_refused() -> None:
    assert set(POLICIES) == {"gpu", "cpu"}
    assert policy_for_tier("cpu") == "cpu"
    assert policy_for_tier("h100") == "gpu"
    with pytest.raises(UnknownPolicyError, match="known: cpu, gpu"):
        scaling_policy("tpu")


@pytest.mark.parametrize("name", POLICIES, ids=lambda n: f"policy_{n}_pool")
@given(
    current=st.integers(0, 20),
    inflight=st.integers(0, 400),
    queued=st.integers(0, 400),
    capacity_each=st.integers(1, 32),
    wait=st.floats(0, 10),
)
def test_need_is_monotone_in_load_and_never_negative(
    name: str, current: int, inflight: int, queued: int, capacity_each: int, wait: float
) -> None:
    policy = scaling_policy(name)
    capacity = current * capacity_each
    base = sig(inflight=inflight, capacity=capacity, ready=current, queued={"1": queued},
               wait_p95_s={"1": wait})  # fmt: skip
    more = sig(inflight=inflight + capacity_each, capacity=capacity, ready=current,
               queued={"1": queued}, wait_p95_s={"1": wait})  # fmt: skip
    a = policy.need(base, current=current, target=TARGET).replicas
    b = policy.need(more, current=current, target=TARGET).replicas
    assert a >= 0
    assert b >= a
    if current == 0:
        assert a == (1 if inflight + queued > 0 else 0)  # scale from zero on demand only


@pytest.mark.parametrize("name", POLICIES, ids=lambda n: f"policy_{n}_pool")
def test_inside_the_band_the_count_is_kept_and_outside_it_moves(name: str) -> None:
    policy = scaling_policy(name)
    assert policy.need(sig(inflight=12, capacity=20), current=2, target=TARGET).replicas == 2
    high = policy.need(sig(inflight=19, capacity=20), current=2, target=TARGET)
    assert high.replicas == 4
    assert "above" in high.why
    low = policy.need(sig(inflight=1, capacity=40), current=4, target=TARGET)
    assert low.replicas == 1
    assert "below" in low.why


def test_gpu_scales_on_kv_use_and_deadline_misses_cpu_does_not_see_kv() -> None:
    kv = sig(inflight=2, capacity=20, kv_usage=0.95)
    assert scaling_policy("gpu").need(kv, current=2, target=TARGET).replicas > 2
    assert scaling_policy("cpu").need(kv, current=2, target=TARGET).replicas < 2
    miss = sig(inflight=10, capacity=20, deadline_miss_per_s=0.5)
    assert "deadline" in scaling_policy("gpu").need(miss, current=2, target=TARGET).why
    shed = sig(inflight=10, capacity=20, shed_per_s=1.0)
    assert scaling_policy("cpu").need(shed, current=2, target=TARGET).replicas == 3


def test_aggregate_sums_counts_and_takes_the_worst_wait() -> None:
    a = sig(inflight=3, queued={"0": 2}, wait_p95_s={"0": 0.5}, capacity=16, ready=2,
            dispatched_per_s=4, kv_usage=0.2)  # fmt: skip
    b = sig(inflight=5, queued={"0": 1, "1": 4}, wait_p95_s={"0": 1.5}, capacity=16, ready=2,
            dispatched_per_s=6)  # fmt: skip
    total = aggregate("p", [a, b])
    assert (total.routers, total.inflight, total.capacity) == (2, 8, 16)
    assert total.queued == {"0": 3, "1": 4}
    assert total.wait_p95_s == {"0": 1.5}
    assert total.dispatched_per_s == 10
    assert total.kv_usage == 0.2
    assert aggregate("p", []).idle


BOUNDS = Bounds(min=0, max=4, warm=1)
COOL = Cooldowns(out_s=5, in_s=30, idle_to_zero_s=60)


def step(signals: PoolSignals, current: int, history: History, now: float, warm: int = 0):  # type: ignore[no-untyped-def]
    return decide(scaling_policy("gpu"), signals, current=current, warm_ready=warm, bounds=BOUNDS,
                  cooldowns=COOL, target=TARGET, history=history, now=now)  # fmt: skip


def test_out_fast_promoting_warm_first_then_out_cooldown() -> None:
    hot = sig(inflight=16, capacity=16)
    plan = step(hot, 2, History(), now=100, warm=1)
    assert (plan.action, plan.desired, plan.promote, plan.start) == ("out", 4, 1, 1)
    assert plan.warm == 0  # no room for a warm replica at max
    again = step(hot, 4, plan.history, now=102)
    assert again.action == "hold"  # at max
    held = step(hot, 2, plan.history, now=103)
    assert held.action == "hold"
    assert "out cooldown" in held.why
    assert step(hot, 2, plan.history, now=105).action == "out"


def test_in_slowly_one_at_a_time_after_the_in_cooldown() -> None:
    cool = sig(inflight=1, capacity=32, dispatched_per_s=1)
    history = History(last_out_at=100)
    assert step(cool, 4, history, now=120).action == "hold"
    plan = step(cool, 4, history, now=131)
    assert (plan.action, plan.desired) == ("in", 3)
    assert step(cool, 3, plan.history, now=140).action == "hold"


def test_idle_pool_goes_to_zero_only_after_the_idle_time() -> None:
    idle = sig()
    first = step(idle, 1, History(), now=1000)
    assert first.action == "hold"
    assert first.desired == 1
    assert first.history.idle_since == 1000
    assert step(idle, 1, first.history, now=1059).action == "hold"
    zero = step(idle, 1, first.history, now=1060)
    assert (zero.action, zero.desired, zero.warm) == ("zero", 0, 0)
    busy = step(sig(inflight=1, capacity=8), 1, first.history, now=1061)
    assert busy.history.idle_since is None
    cold = step(sig(queued={"1": 1}), 0, zero.history, now=1070)
    assert (cold.action, cold.desired, cold.start) == ("out", 1, 1)


def test_bounds_and_band_are_checked() -> None:
    with pytest.raises(ValueError, match="min <= max"):
        Bounds(min=3, max=2)
    with pytest.raises(ValueError, match="low < high"):
        ScalingTarget(low=0.9, high=0.5)


@pytest.mark.parametrize("name", POLICIES, ids=lambda n: f"policy_{n}_pool")
def test_ttft_over_the_class_slo_adds_a_replica_while_busy(name: str) -> None:
    policy = scaling_policy(name)
    slow = sig(inflight=10, capacity=20, ttft_slo_ratio=1.6, ttft_p95_s={"interactive": 0.8})
    need = policy.need(slow, current=2, target=TARGET)
    assert need.replicas == 3
    assert "latency p95 at 1.60x its class objective" in need.why  # TTFT or unary e2e (#33)
    within = sig(inflight=10, capacity=20, ttft_slo_ratio=0.9)
    assert policy.need(within, current=2, target=TARGET).replicas == 2
    idle = sig(inflight=0, capacity=20, ttft_slo_ratio=3.0)  # a past slow request, no load now
    assert policy.need(idle, current=2, target=TARGET).replicas < 2


def test_cpu_scales_encoder_pools_on_batch_fill_gpu_does_not() -> None:
    full = sig(inflight=4, capacity=20, batch_fill=0.95, batch_compute_s=0.2)
    cpu = scaling_policy("cpu").need(full, current=2, target=TARGET)
    assert cpu.replicas > 2
    assert "batch fill 0.95 above" in cpu.why
    assert scaling_policy("gpu").need(full, current=2, target=TARGET).replicas < 2
    half = sig(inflight=4, capacity=20, batch_fill=0.5)
    assert scaling_policy("cpu").need(half, current=2, target=TARGET).replicas == 2


def test_cpu_scales_in_after_a_queue_has_drained() -> None:
    """A queue-wait p95 from requests that waited earlier does not hold replicas once nothing
    is queued (the ramp test's scale-in)."""
    drained = sig(inflight=1, capacity=12, wait_p95_s={"1": 1.1})
    assert scaling_policy("cpu").need(drained, current=3, target=TARGET).replicas < 3
    queued = sig(inflight=1, capacity=12, queued={"1": 1}, wait_p95_s={"1": 1.1})
    assert scaling_policy("cpu").need(queued, current=3, target=TARGET).replicas == 4


def test_aggregate_takes_the_worst_ttft_and_batch_readings() -> None:
    a = sig(ttft_p95_s={"std": 0.4}, ttft_slo_ratio=0.2, batch_fill=0.3, batch_compute_s=0.1)
    b = sig(ttft_p95_s={"std": 0.9, "int": 0.3}, ttft_slo_ratio=1.2)
    total = aggregate("p", [a, b])
    assert total.ttft_p95_s == {"std": 0.9, "int": 0.3}
    assert total.ttft_slo_ratio == 1.2
    assert (total.batch_fill, total.batch_compute_s) == (0.3, 0.1)
    assert aggregate("p", [b]).batch_fill is None


def test_a_pool_below_its_minimum_says_so() -> None:
    plan = decide(scaling_policy("cpu"), sig(), current=0, warm_ready=0,
                  bounds=Bounds(min=1, max=2), cooldowns=COOL, target=TARGET, history=History(),
                  now=10)  # fmt: skip
    assert (plan.action, plan.desired, plan.start) == ("out", 1, 1)
    assert plan.why == "no replica serves and no demand; raised to the minimum of 1"
