"""Scaling policies: from a pool's signals to the replicas it needs now (before cooldowns).

A policy is a pure function of the aggregated :class:`PoolSignals`, the replicas serving now
and the pool's :class:`ScalingTarget`; it answers a :class:`Need` (replicas and the signal that
decided). The controller (:mod:`runtime.scaling.controller`) applies bounds, cooldowns,
warm promotion and scale-to-zero on top. GPU and CPU pools scale on different signals:

- ``gpu``: load is the largest of in-flight/capacity and KV-cache use; queue waits over the
  wait SLO, a TTFT p95 over its class's TTFT SLO or any deadline miss add a replica even
  inside the band.
- ``cpu``: load is the largest of in-flight/capacity and, for encoder pools, the batchers'
  batch fill (no KV cache); a queue that builds up (waits over the SLO), sheds, or a TTFT p95
  over its class's SLO adds a replica.

Inside the target band ``[low, high]`` the current count is kept (hysteresis); outside it the
count that brings load back to the band's middle is asked for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Protocol

from runtime.scaling.signals import PoolSignals


@dataclass(frozen=True, slots=True)
class ScalingTarget:
    low: float = 0.4  # utilisation below this: fewer replicas
    high: float = 0.8  # above this: more replicas
    wait_slo_s: float = 1.0  # queue-wait p95 (any band) above this: more replicas

    def __post_init__(self) -> None:
        if not 0 < self.low < self.high <= 1.5:
            raise ValueError(f"need 0 < low < high <= 1.5, got {self.low}, {self.high}")
        if not self.wait_slo_s > 0:
            raise ValueError("wait_slo_s must be > 0")

    @property
    def middle(self) -> float:
        return (self.low + self.high) / 2


@dataclass(frozen=True, slots=True)
class Need:
    replicas: int
    why: str


class ScalingPolicy(Protocol):
    name: ClassVar[str]

    def need(self, signals: PoolSignals, *, current: int, target: ScalingTarget) -> Need: ...


def _band_need(load: float, what: str, *, current: int, target: ScalingTarget) -> Need:
    if current == 0:
        return Need(0, "no replica serves and no demand")
    if load > target.high:
        n = math.ceil(current * load / target.middle)
        return Need(max(n, current + 1), f"{what} {load:.2f} above {target.high:.2f}")
    if load < target.low:
        n = math.ceil(current * load / target.middle)
        return Need(min(n, current - 1), f"{what} {load:.2f} below {target.low:.2f}")
    return Need(current, f"{what} {load:.2f} within [{target.low:.2f}, {target.high:.2f}]")


def _demand_without_replicas(signals: PoolSignals, current: int) -> Need | None:
    if current > 0:
        return None
    if signals.queued_total + signals.inflight > 0:
        return Need(1, f"{signals.queued_total} queued and no replica: scale from zero")
    return Need(0, "no replica serves and no demand")


def _worst_wait(signals: PoolSignals) -> float:
    return max(signals.wait_p95_s.values(), default=0.0)


def _ttft_over_slo(signals: PoolSignals, need: Need, current: int) -> Need | None:
    """One more replica while requests wait or run and their TTFT p95 exceeds the class SLO."""
    busy = signals.queued_total + signals.inflight > 0
    if signals.ttft_slo_ratio > 1.0 and busy and need.replicas <= current:
        ratio = signals.ttft_slo_ratio
        return Need(current + 1, f"latency p95 at {ratio:.2f}x its class objective")
    return None


class GpuPolicy:
    """Token-aware: in-flight and KV use against capacity, queue waits, TTFT against the class
    SLO and deadline misses."""

    name: ClassVar[str] = "gpu"

    def need(self, signals: PoolSignals, *, current: int, target: ScalingTarget) -> Need:
        cold = _demand_without_replicas(signals, current)
        if cold is not None:
            return cold
        load = signals.utilisation if signals.capacity else 0.0
        what = "in-flight/capacity"
        if signals.kv_usage is not None and signals.kv_usage > load:
            load, what = signals.kv_usage, "KV-cache use"
        need = _band_need(load, what, current=current, target=target)
        wait = _worst_wait(signals)
        if signals.deadline_miss_per_s > 0 and need.replicas <= current:
            return Need(current + 1, f"{signals.deadline_miss_per_s:.2f}/s deadline misses")
        if wait > target.wait_slo_s and signals.queued_total and need.replicas <= current:
            return Need(current + 1, f"queue-wait p95 {wait:.2f}s over {target.wait_slo_s:.2f}s")
        return _ttft_over_slo(signals, need, current) or need


class CpuPolicy:
    """Request-aware: in-flight (or encoder batch fill) against capacity, queue waits,
    shedding and TTFT against the class SLO; no KV cache."""

    name: ClassVar[str] = "cpu"

    def need(self, signals: PoolSignals, *, current: int, target: ScalingTarget) -> Need:
        cold = _demand_without_replicas(signals, current)
        if cold is not None:
            return cold
        load = signals.utilisation if signals.capacity else 0.0
        what = "in-flight/capacity"
        if signals.batch_fill is not None and signals.batch_fill > load:
            load, what = signals.batch_fill, "batch fill"
        need = _band_need(load, what, current=current, target=target)
        wait = _worst_wait(signals) if signals.queued_total else 0.0  # a queue now, not a past one
        if (signals.shed_per_s > 0 or wait > target.wait_slo_s) and need.replicas <= current:
            return Need(
                current + 1, f"queue building: p95 {wait:.2f}s, shed {signals.shed_per_s:.2f}/s"
            )
        return _ttft_over_slo(signals, need, current) or need
