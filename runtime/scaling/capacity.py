"""The capacity planner's model: demand and measured throughput curves -> replicas per tier.

Per tier, three constraints, each as "replicas of load" (demand over one replica's rate):

- **prefill**: ``rate * prompt_mean`` tokens/s over the best measured prefill tokens/s;
- **decode**: ``rate * output_mean`` tokens/s over the decode tokens/s at the largest measured
  batch size the tier may run: limited by KV memory (``kv_tokens // (prompt_mean + output_mean)``
  sequences) and by the tightest inter-token-latency SLO of the classes in the mix (per
  sequence, one token every ``batch / decode_tps(batch)`` seconds);
- **kv**: the sequences resident at once (Little's law: ``rate * latency``, latency = prefill
  time + ``output_mean`` decode steps at that batch) times ``prompt_mean + output_mean`` tokens,
  over ``kv_tokens``.

The largest is the *binding* constraint. ``base = ceil(load / (1 - headroom))`` replicas; with
``z >= 2`` zones every zone holds ``ceil(base / (z - 1))`` so losing any one zone still leaves
``base`` (the z/(z-1) redundancy), total ``z * ceil(base / (z - 1))``.

File formats (JSON) — demand::

    {"rate_rps": 10, "prompt_tokens": {"mean": 500}, "output_tokens": {"mean": 100},
     "classes": {"interactive": {"share": 0.3, "max_itl_ms": 50}, "batch": {"share": 0.7}}}

curves (``bench`` or ``plan_capacity --measure-simulator`` writes them)::

    {"tiers": {"h100": {"kv_tokens": 65536,
                        "points": [{"batch": 1, "prefill_tps": 5000, "decode_tps": 95}, ...]}}}
"""

from __future__ import annotations

import math
from typing import Literal

import msgspec

Constraint = Literal["prefill", "decode", "kv"]


class Tokens(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    mean: float
    p95: float | None = None


class ClassMix(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    share: float
    max_itl_ms: float | None = None


class Demand(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    rate_rps: float
    prompt_tokens: Tokens
    output_tokens: Tokens
    classes: dict[str, ClassMix] = msgspec.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rate_rps < 0 or self.prompt_tokens.mean < 0 or self.output_tokens.mean <= 0:
            raise ValueError("rate and prompt length must be >= 0 and output length > 0")


class CurvePoint(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    batch: int
    prefill_tps: float
    decode_tps: float  # output tokens/s of the whole batch


class TierCurve(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    kv_tokens: int
    points: list[CurvePoint]

    def __post_init__(self) -> None:
        if not self.points or self.kv_tokens <= 0:
            raise ValueError("a tier needs kv_tokens > 0 and at least one point")
        if any(p.batch < 1 or p.prefill_tps <= 0 or p.decode_tps <= 0 for p in self.points):
            raise ValueError("every point needs batch >= 1 and positive token rates")


class Curves(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    tiers: dict[str, TierCurve]


class TierPlan(msgspec.Struct, frozen=True):
    tier: str
    replicas: int
    base: int
    binding: Constraint
    load: dict[str, float]  # constraint -> replicas of load
    batch: int  # the decode batch size planned with


def _decode_batch(curve: TierCurve, demand: Demand) -> CurvePoint:
    seq_tokens = demand.prompt_tokens.mean + demand.output_tokens.mean
    kv_limit = max(1, int(curve.kv_tokens // seq_tokens)) if seq_tokens > 0 else 1 << 30
    itls = [c.max_itl_ms for c in demand.classes.values() if c.share > 0 and c.max_itl_ms]
    itl_s = min(itls) / 1000 if itls else math.inf
    points = sorted(curve.points, key=lambda p: p.batch)
    allowed = [p for p in points if p.batch <= kv_limit and p.batch / p.decode_tps <= itl_s]
    return allowed[-1] if allowed else points[0]


def plan_tier(
    tier: str, curve: TierCurve, demand: Demand, *, headroom: float, zones: int
) -> TierPlan:
    if not 0 <= headroom < 1:
        raise ValueError(f"headroom must be in [0, 1), got {headroom}")
    if zones < 1:
        raise ValueError(f"zones must be >= 1, got {zones}")
    point = _decode_batch(curve, demand)
    prefill_tps = max(p.prefill_tps for p in curve.points)
    prompt, output = demand.prompt_tokens.mean, demand.output_tokens.mean
    latency = prompt / prefill_tps + output * point.batch / point.decode_tps
    load: dict[str, float] = {
        "prefill": demand.rate_rps * prompt / prefill_tps,
        "decode": demand.rate_rps * output / point.decode_tps,
        "kv": demand.rate_rps * latency * (prompt + output) / curve.kv_tokens,
    }
    binding: Constraint = max(("prefill", "decode", "kv"), key=lambda k: load[k])
    base = math.ceil(round(load[binding] / (1 - headroom), 9))
    replicas = base if zones == 1 else zones * math.ceil(base / (zones - 1))
    return TierPlan(tier, replicas, base, binding, load, point.batch)


def plan(curves: Curves, demand: Demand, *, headroom: float, zones: int) -> list[TierPlan]:
    return [
        plan_tier(name, curve, demand, headroom=headroom, zones=zones)
        for name, curve in sorted(curves.tiers.items())
    ]
