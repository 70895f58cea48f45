"""The capacity planner's formulas against hand-computed cases."""

from __future__ import annotations

import pytest

from runtime.scaling.capacity import ClassMix, CurvePoint, Demand, TierCurve, Tokens, plan_tier

pytestmark = pytest.mark.unit

CURVE = TierCurve(
    kv_tokens=32768,
    points=[
        CurvePoint(batch=1, prefill_tps=10000, decode_tps=100),
        CurvePoint(batch=8, prefill_tps=10000, decode_tps=600),
        CurvePoint(batch=32, prefill_tps=10000, decode_tps=1600),
    ],
)


def demand(rate: float, prompt: float, output: float, **classes: ClassMix) -> Demand:
    return Demand(rate_rps=rate, prompt_tokens=Tokens(prompt), output_tokens=Tokens(output),
                  classes=dict(classes))  # fmt: skip


def test_decode_bound_with_headroom_and_three_zones() -> None:
    # prefill 10*500/10000 = 0.5; decode at batch 32: 10*100/1600 = 0.625;
    # kv: latency 0.05 + 100*32/1600 = 2.05 s, 20.5 seqs * 600 tokens / 32768 = 0.3754
    p = plan_tier("t", CURVE, demand(10, 500, 100), headroom=0.2, zones=3)
    assert p.batch == 32
    assert p.binding == "decode"
    assert p.load["prefill"] == pytest.approx(0.5)
    assert p.load["decode"] == pytest.approx(0.625)
    assert p.load["kv"] == pytest.approx(20.5 * 600 / 32768)
    assert p.base == 1  # ceil(0.625 / 0.8)
    assert p.replicas == 3  # 3 zones * ceil(1 / 2): losing a zone still leaves one


def test_prefill_bound_on_long_prompts() -> None:
    # prefill 10*4000/10000 = 4.0; kv limit 32768//4010 = 8 -> batch 8: decode 100/600
    p = plan_tier("t", CURVE, demand(10, 4000, 10), headroom=0.0, zones=1)
    assert p.batch == 8
    assert p.binding == "prefill"
    assert (p.base, p.replicas) == (4, 4)


def test_an_itl_slo_limits_the_batch_and_kv_can_bind() -> None:
    # ITL 10 ms: batch 1 (10 ms/token) ok, batch 8 (13.3 ms) not -> batch 1: decode 2*50/100 = 1;
    # kv: latency 3000/10000 + 50*1/100 = 0.8 s, 1.6 seqs * 3050 / 32768 = 0.1489
    p = plan_tier("t", CURVE, demand(2, 3000, 50, chat=ClassMix(share=1, max_itl_ms=10)),
                  headroom=0.5, zones=2)  # fmt: skip
    assert p.batch == 1
    assert p.binding == "decode"
    assert p.load["decode"] == pytest.approx(1.0)
    assert (p.base, p.replicas) == (2, 4)  # ceil(1/0.5) = 2; 2 zones * ceil(2/1)
    small_kv = TierCurve(kv_tokens=1000, points=CURVE.points)
    kv = plan_tier("t", small_kv, demand(1, 900, 100), headroom=0, zones=1)
    # batch 1 (1000//1000); latency 0.09 + 1 = 1.09 s -> 1.09 * 1000 / 1000 = 1.09 > decode 1.0
    assert kv.binding == "kv"
    assert kv.load["kv"] == pytest.approx(1.09)
    assert kv.base == 2


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="headroom"):
        plan_tier("t", CURVE, demand(1, 1, 1), headroom=1.0, zones=1)
    with pytest.raises(ValueError, match="zones"):
        plan_tier("t", CURVE, demand(1, 1, 1), headroom=0, zones=0)
    with pytest.raises(ValueError, match="at least one point"):
        TierCurve(kv_tokens=1, points=[])
