"""The per-replica adapter LRU with minimum residency (runtime.workers.adapters)."""

from __future__ import annotations

import pytest

from runtime.pool_policies import pool_policy_errors
from runtime.workers.adapters import AdapterSlots, Load, LoraSettings, Pinned, Resident

pytestmark = pytest.mark.unit


def _fill(slots: AdapterSlots, *names: str, now: float = 0.0) -> None:
    for name in names:
        assert slots.decide(name, now=now) == Load(name)
        slots.loaded(name, now=now)


def test_free_slot_loads_then_hits() -> None:
    slots = AdapterSlots(capacity=2, min_residency_s=10)
    _fill(slots, "a")
    assert slots.decide("a", now=1) == Resident("a")
    assert slots.resident() == ("a",)


def test_full_evicts_the_least_recently_used_past_residency() -> None:
    slots = AdapterSlots(capacity=2, min_residency_s=10)
    _fill(slots, "a", "b")
    assert slots.decide("a", now=20) == Resident("a")  # b is now the LRU
    assert slots.decide("c", now=20) == Load("c", evict="b")
    slots.unloaded("b")
    slots.loaded("c", now=20)
    assert slots.resident() == ("a", "c")


def test_young_adapters_are_skipped_not_evicted() -> None:
    slots = AdapterSlots(capacity=2, min_residency_s=10)
    _fill(slots, "a", now=0)
    _fill(slots, "b", now=8)
    assert slots.decide("b", now=9) == Resident("b")
    # a is the LRU and old enough at 12; b (loaded at 8) is pinned until 18
    assert slots.decide("c", now=12) == Load("c", evict="a")


def test_all_pinned_says_when_a_slot_frees() -> None:
    slots = AdapterSlots(capacity=2, min_residency_s=10)
    _fill(slots, "a", now=0)
    _fill(slots, "b", now=4)
    decision = slots.decide("c", now=6)
    assert isinstance(decision, Pinned)
    assert decision.retry_after_s == pytest.approx(4.0)
    assert "c" not in slots


def test_no_thrash_between_two_adapters_on_one_slot() -> None:
    slots = AdapterSlots(capacity=1, min_residency_s=5)
    _fill(slots, "a", now=0)
    loads = 0
    for step in range(1, 40):
        now = step * 0.5
        name = "b" if step % 2 else "a"
        decision = slots.decide(name, now=now)
        if isinstance(decision, Load):
            loads += 1
            slots.unloaded(decision.evict or "")
            slots.loaded(name, now=now)
    assert loads <= 4  # one swap per residency period at most (19.5 s / 5 s)


def test_rejects_bad_parameters() -> None:
    with pytest.raises(ValueError, match="capacity"):
        AdapterSlots(capacity=0)
    with pytest.raises(ValueError, match="min_residency_s"):
        AdapterSlots(capacity=1, min_residency_s=-1)


def test_an_adapter_resident_elsewhere_is_evicted_first() -> None:
    slots = AdapterSlots(capacity=2, min_residency_s=0)
    _fill(slots, "a", "b")
    assert slots.decide("c", now=1) == Load("c", evict="a")  # the LRU
    assert slots.decide("c", now=1, spare={"b"}) == Load("c", evict="b")  # b is elsewhere too


def test_pinned_for_changes_nothing_and_seen_joins_as_the_lru() -> None:
    slots = AdapterSlots(capacity=2, min_residency_s=10)
    assert slots.pinned_for(now=0) is None
    _fill(slots, "a", now=0)
    _fill(slots, "b", now=4)
    assert slots.pinned_for(now=6) == pytest.approx(4.0)
    assert slots.pinned_for(now=10) is None
    assert slots.resident() == ("a", "b")
    other = AdapterSlots(capacity=2, min_residency_s=10)
    _fill(other, "a", now=0)
    other.seen("x", now=1)  # another router loaded it: least recently used, evictable now
    assert other.resident() == ("x", "a")
    assert other.decide("c", now=1) == Load("c", evict="x")  # a is still pinned


def test_lora_settings_from_pool_policies() -> None:
    assert LoraSettings.from_policies({}) == LoraSettings(max_loras=2, max_cpu_loras=8)
    assert LoraSettings.from_policies({"max_loras": "12"}) == LoraSettings(12, 12)
    assert LoraSettings.from_policies({"max_loras": "4", "max_cpu_loras": " 6 "}).max_cpu_loras == 6
    for bad, message in (
        ({"max_loras": "0"}, "max_loras must be >= 1"),
        ({"max_loras": "four"}, "whole number"),
        ({"max_loras": "4", "max_cpu_loras": "2"}, "must be >= max_loras"),
    ):
        with pytest.raises(ValueError, match=message):
            LoraSettings.from_policies(bad)
        assert any(message in error for error in pool_policy_errors(bad))  # refused where written
    assert pool_policy_errors({"max_loras": "4", "max_cpu_loras": "8"}) == []
