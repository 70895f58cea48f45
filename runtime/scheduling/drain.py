"""How fast a pool queue drains: token cost dispatched per second of backlog.

The estimate must reflect capacity, not demand. So it only learns while the queue is
backlogged: time counts while the queue holds requests, and a dispatch's cost counts only
when requests are still queued after it (a dispatch that empties the queue says the endpoints
kept up, not how fast they can go — counting it would inflate the rate under light load).

Both sums decay exponentially with backlogged time (``half_life_s``), so the estimate follows
changes in capacity and keeps its last value through idle periods. It starts from a prior
(``prior_rate`` worth ``prior_s`` seconds of evidence) that fades as evidence accrues, so a
fresh router gives a sane wait instead of infinity or zero.

Use: after every change to the queue (push, pop, remove, expire) call
``observe(now=..., queued=len(queue))``, passing ``dispatched_cost=req.cost`` for a pop.
"""

from __future__ import annotations

import math


class DrainRate:
    __slots__ = ("_den", "_half_life_s", "_last", "_num", "_queued")

    def __init__(
        self, *, half_life_s: float = 10.0, prior_rate: float = 1000.0, prior_s: float = 1.0
    ) -> None:
        for name, value in (
            ("half_life_s", half_life_s),
            ("prior_rate", prior_rate),
            ("prior_s", prior_s),
        ):
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive number, got {value!r}")
        self._half_life_s = half_life_s
        self._num = prior_rate * prior_s  # decayed token cost
        self._den = prior_s  # decayed backlogged seconds
        self._last: float | None = None
        self._queued = 0

    def observe(self, *, now: float, queued: int, dispatched_cost: float = 0.0) -> None:
        """The queue now holds ``queued`` requests; ``dispatched_cost`` was just released."""
        if self._last is not None and self._queued > 0 and now > self._last:
            busy = now - self._last
            decay = 0.5 ** (busy / self._half_life_s)
            tau = self._half_life_s / math.log(2)
            self._num *= decay
            # The decayed weight of the busy interval itself: integral of e^(-s/tau) ds.
            self._den = self._den * decay + tau * (1.0 - decay)
        if dispatched_cost > 0 and queued > 0:
            self._num += dispatched_cost
        if self._last is None or now > self._last:
            self._last = now
        self._queued = queued

    def rate(self) -> float:
        """Estimated token cost drained per second while backlogged (always > 0)."""
        return self._num / self._den

    def estimated_wait(self, work_ahead: float) -> float:
        """Seconds until ``work_ahead`` (token cost) has been dispatched."""
        return max(work_ahead, 0.0) / self.rate()


def retry_after_s(wait_s: float) -> int:
    """A ``Retry-After`` header value (whole seconds, at least 1) from an estimated wait."""
    if not math.isfinite(wait_s):
        return 3600
    return max(1, math.ceil(wait_s))
