"""The controller's decision for one pool, as a pure function of its signals and history.

:func:`decide` takes what the policy needs, clamps it to the pool's ``[min, max]``, and applies
the timing rules:

- scale out at once to the full need, unless the last scale-out is less than ``out_s`` ago;
  warm replicas (loaded, not routed) are promoted before cold ones are started;
- scale in one replica at a time, only ``in_s`` after the last change in either direction
  (slow in: a dip does not undo a ramp);
- below ``min=0`` the floor is one replica until the pool has been idle (nothing queued, in
  flight or dispatched) for ``idle_to_zero_s``; then zero (None: never to zero);
- keep ``warm`` extra replicas loaded but unrouted while any replica serves.

The returned :class:`Plan` says what to do and why, and carries the new history to keep.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from runtime.scaling.policies import ScalingPolicy, ScalingTarget
from runtime.scaling.signals import PoolSignals

Action = Literal["out", "in", "hold", "zero"]


@dataclass(frozen=True, slots=True)
class Bounds:
    min: int = 0
    max: int = 1
    warm: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.min <= self.max or not 0 <= self.warm <= self.max:
            raise ValueError(f"need 0 <= min <= max and 0 <= warm <= max: {self}")


@dataclass(frozen=True, slots=True)
class Cooldowns:
    out_s: float = 5.0
    in_s: float = 60.0
    idle_to_zero_s: float | None = 300.0


@dataclass(frozen=True, slots=True)
class History:
    last_out_at: float | None = None
    last_in_at: float | None = None
    idle_since: float | None = None


@dataclass(frozen=True, slots=True)
class Plan:
    action: Action
    current: int
    desired: int
    why: str
    promote: int = 0  # warm replicas to route (scale out)
    start: int = 0  # cold replicas to start (scale out)
    warm: int = 0  # warm replicas to keep after this step
    history: History = History()


def decide(
    policy: ScalingPolicy,
    signals: PoolSignals,
    *,
    current: int,
    warm_ready: int,
    bounds: Bounds,
    cooldowns: Cooldowns,
    target: ScalingTarget,
    history: History,
    now: float,
) -> Plan:
    """What to do with a pool serving ``current`` replicas (``warm_ready`` more loaded)."""
    idle_since = (history.idle_since or now) if signals.idle else None
    history = replace(history, idle_since=idle_since)
    need = policy.need(signals, current=current, target=target)
    desired = min(max(need.replicas, bounds.min), bounds.max)
    why = need.why
    if need.replicas < bounds.min and desired > current:
        why = f"{why}; raised to the minimum of {bounds.min}"
    if desired == 0 and current > 0:
        idle_for = now - idle_since if idle_since is not None else 0.0
        limit = cooldowns.idle_to_zero_s
        if limit is not None and idle_since is not None and idle_for >= limit:
            plan = Plan("zero", current, 0, f"idle for {idle_for:.0f}s >= {limit:.0f}s", 0, 0, 0)
            return replace(plan, history=replace(history, last_in_at=now))
        desired = 1
        why = f"{why}; kept at one until idle for {limit}s" if limit is not None else why
    warm = bounds.warm if max(desired, current) > 0 else 0
    warm = min(warm, bounds.max - min(desired, bounds.max))
    if desired > current:
        if history.last_out_at is not None and now - history.last_out_at < cooldowns.out_s:
            wait = cooldowns.out_s - (now - history.last_out_at)
            return Plan("hold", current, current, f"{why}; out cooldown {wait:.1f}s left",
                        warm=warm, history=history)  # fmt: skip
        promote = min(warm_ready, desired - current)
        return Plan("out", current, desired, why, promote, desired - current - promote, warm,
                    replace(history, last_out_at=now))  # fmt: skip
    if desired < current:
        last = max(history.last_out_at or -1e18, history.last_in_at or -1e18)
        if now - last < cooldowns.in_s:
            wait = cooldowns.in_s - (now - last)
            return Plan("hold", current, current, f"{why}; in cooldown {wait:.1f}s left",
                        warm=warm, history=history)  # fmt: skip
        return Plan("in", current, current - 1, why, warm=warm,
                    history=replace(history, last_in_at=now))  # fmt: skip
    return Plan("hold", current, current, why, warm=warm, history=history)
