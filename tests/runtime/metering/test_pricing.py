"""Prices in micro-credits, the worst case asked at admission, and the fairness weight."""

from __future__ import annotations

import pytest
from fixtures.router import World

from runtime.admission.credits import (
    NO_ASK,
    CreditAsk,
    CreditKind,
    CreditRefusedError,
    LocalCredits,
)
from runtime.admission.limits import Lease, Quota
from runtime.gateway.admit import Admission, credit_ask, fair_weight
from runtime.gateway.plan import Plan
from runtime.metering.pricing import PriceBook, Rate, to_credits
from runtime.snapshot import CreditSnap, PriceSnap, Snapshot

pytestmark = pytest.mark.unit

H100 = PriceSnap(version=1, hardware_tier="h100", input_per_1k=3.0, output_per_1k=6.0,
                 cache_hit_discount=0.5)  # fmt: skip
CPU = PriceSnap(version=1, hardware_tier="cpu", input_per_1k=0.5, output_per_1k=1.0,
                cache_hit_discount=0.0)  # fmt: skip


def test_cost_is_tokens_times_the_tier_price_rounded_up() -> None:
    h100, cpu = Rate.of(H100), Rate.of(CPU)
    assert h100.cost(1000, 0) == 3_000_000  # 3 credits per 1k input tokens
    assert h100.cost(0, 1) == 6_000  # 6 credits per 1k output = 6000 µc a token
    assert cpu.cost(3, 1) == 2_500
    assert h100.cost(10, 10) > cpu.cost(10, 10)  # an H100 token costs more
    assert h100.cost(10, 10, cached=True) == h100.cost(10, 10) // 2
    assert Rate(input_uc=0.3, output_uc=0.0).cost(1, 0) == 1  # rounded up, never free
    assert Rate(input_uc=0.0, output_uc=0.0).free


def test_a_batch_line_costs_the_price_less_the_batch_discount() -> None:
    half_off = PriceSnap(version=1, hardware_tier="h100", input_per_1k=3.0, output_per_1k=6.0,
                         cache_hit_discount=0.5, batch_discount=0.5)  # fmt: skip
    online = Rate.of(half_off)
    batch = online.for_batch()
    assert online.cost(1000, 100) == 3_600_000  # online: the full price
    assert batch.cost(1000, 100) == 1_800_000  # a batch line: half
    assert batch.cost(1000, 100, cached=True) == 900_000  # a cached batch line: both discounts
    assert Rate.of(H100).for_batch() == Rate.of(H100)  # no batch discount: the same rate
    free = PriceSnap(version=1, hardware_tier="cpu", input_per_1k=1.0, output_per_1k=1.0,
                     batch_discount=7.0)  # out of range (the control plane refuses it)
    assert Rate.of(free).for_batch().cost(1000, 1000) == 0  # clamped to 100 %


def test_price_book_looks_up_version_and_tier() -> None:
    book = PriceBook(Snapshot(version=3, created_at=0.0, prices=(H100, CPU)))
    assert book.rate(1, "cpu") == Rate.of(CPU)
    assert book.rate(1, "a100") is None
    assert book.rate(2, "cpu") is None


def test_credit_amounts_print_with_six_places() -> None:
    assert to_credits(1_500_000) == "1.500000"
    assert to_credits(7) == "0.000007"
    assert to_credits(-2_000_001) == "-2.000001"


def _plan(world: World, prompt: int, max_tokens: int) -> Plan:
    world.add_model("m", 1)
    return Plan(model=world.models["m"], version=world.versions[1], klass=None, deadline=0.0,
                streaming=False, include_usage=False, body=b"", prompt_tokens=prompt,
                max_tokens=max_tokens)  # fmt: skip


def test_the_ask_is_the_worst_case_with_the_tenant_settings() -> None:
    world = World()
    world.add_tenant("t")
    plan = _plan(world, 100, 50)
    snap = Snapshot(version=1, created_at=0.0, credits={
        "t": CreditSnap(overdraft="batch", day_cap=2.5)})  # fmt: skip
    ask = credit_ask(snap, world.tenants["t"], plan, Rate.of(H100), now=0.0)
    assert ask.need_uc == 100 * 3_000 + 50 * 6_000
    assert (ask.day_cap_uc, ask.month_cap_uc, ask.overdraft_batch) == (2_500_000, -1, True)
    assert ask.day_field == "day:19700101"
    assert ask.month_field == "month:197001"
    assert credit_ask(snap, world.tenants["t"], plan, None, now=0.0) is NO_ASK  # unpriced: free


def test_fairness_weight_counts_credits_not_tokens() -> None:
    world = World()
    world.add_tenant("t")
    tenant = world.tenants["t"]
    lease = Lease(id="x", tenant="t", quota=Quota(rpm=1, tpm=1, concurrency=1), tokens=1,
                  source="redis")  # fmt: skip
    on_h100 = fair_weight(tenant, Admission(lease=lease, rate=Rate.of(H100), tier="h100"))
    on_cpu = fair_weight(tenant, Admission(lease=lease, rate=Rate.of(CPU), tier="cpu"))
    free = fair_weight(tenant, Admission(lease=lease, rate=None, tier="cpu"))
    assert free == tenant.weight
    # VTC charges tokens / weight: with these weights one H100 token advances the counter 6x
    # as much as a CPU token, as its price does (3 vs 0.5 credits per 1k).
    assert on_cpu / on_h100 == pytest.approx(6.0)
    assert on_h100 == pytest.approx(tenant.weight / 3.0)  # (3 + 6) / 3 credits per 1k


def test_local_fallback_rule() -> None:
    local = LocalCredits(replicas=2)
    local.learn("t", available_uc=1_000, room_uc=-1)
    assert local.hold("t", NO_ASK) == (0, False)
    ask = CreditAsk(need_uc=300, day_field="d", month_field="m")
    assert local.hold("t", ask) == (300, False)
    with pytest.raises(CreditRefusedError) as refused:
        local.hold("t", ask)  # 1000 / 2 - 300 = 200 left
    assert refused.value.kind is CreditKind.CREDITS
    assert refused.value.available_uc == 200
    local.learn("capped", available_uc=10_000, room_uc=400)
    with pytest.raises(CreditRefusedError) as capped:
        local.hold("capped", ask)  # budget room 400 / 2 = 200
    assert capped.value.kind is CreditKind.BUDGET
    overdraft = CreditAsk(need_uc=10**9, day_field="d", month_field="m", overdraft_batch=True)
    assert local.hold("t", overdraft) == (0, True)
