"""How much work is ahead of a request: the input to deadline-aware admission and
``Retry-After``.

An estimate, not a promise, computed from what is queued now:

- every request queued in a more urgent band is ahead (the lower bands' guaranteed shares
  and later urgent arrivals are ignored; they roughly cancel);
- the tenant's own requests that its ordering policy puts first are ahead;
- every other tenant of the band is expected to be served in proportion to its weight while
  the tenant works through its own requests up to this one (weighted fair share), capped at
  what that tenant has queued. For FCFS or round robin this is only an approximation.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from runtime.scheduling.interfaces import QueuedRequest


@dataclass(frozen=True, slots=True)
class Ahead:
    requests: int
    cost: float  # estimated token cost


@dataclass(frozen=True, slots=True)
class BandView:
    length: int
    cost: float


@dataclass(frozen=True, slots=True)
class TenantView:
    length: int
    cost: float
    weight: float


def estimate_ahead(
    req: QueuedRequest,
    less: Callable[[QueuedRequest, QueuedRequest], bool],
    *,
    higher: Iterable[BandView],
    own: Iterable[QueuedRequest],
    others: Iterable[TenantView],
) -> Ahead:
    """Requests and token cost expected to be dispatched before ``req``."""
    count = 0
    cost = 0.0
    for band in higher:
        count += band.length
        cost += band.cost
    through = req.cost
    for other in own:
        if less(other, req):
            count += 1
            cost += other.cost
            through += other.cost
    for tenant in others:
        allowance = through * tenant.weight / req.weight
        if tenant.cost <= allowance:
            count += tenant.length
            cost += tenant.cost
        else:
            count += math.floor(tenant.length * allowance / tenant.cost)
            cost += allowance
    return Ahead(count, cost)
