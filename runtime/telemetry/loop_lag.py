"""The event loop's lag: how late a periodic wake-up runs, as a Prometheus histogram.

A timer callback is scheduled ``interval_s`` ahead at a time and records how much later than
asked it ran: the time the loop was busy with other callbacks (or the process had no CPU).
Its histogram ``switchyard_event_loop_lag_seconds`` is what the bench scrapes before and after
each phase (``bench/profile.py``: the phase's sample count, p50/p99 by bucket bound, mean): a
router that waits rather than computes shows a small lag while its latency grows; one whose
loop stalls shows it here. A stall longer than ``interval_s`` is always seen (the pending
wake-up runs after it); a shorter one is seen when a wake-up falls in it.

Cost: one plain callback per interval (``loop.call_at``: no task, no future; issue #27), at
10 per second by default.
"""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry, Histogram

LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class LoopLagProbe:
    """``start()`` in the lifespan (in the running loop), ``stop()`` at shutdown."""

    def __init__(self, registry: CollectorRegistry, *, interval_s: float = 0.1) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = interval_s
        self.lag = Histogram(
            "switchyard_event_loop_lag_seconds",
            "How late the event loop ran a periodic wake-up (its busy time), per sample.",
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self._timer: asyncio.TimerHandle | None = None

    def start(self) -> None:
        if self._timer is None:
            loop = asyncio.get_running_loop()
            self._arm(loop, loop.time() + self.interval_s)

    async def stop(self) -> None:
        timer, self._timer = self._timer, None
        if timer is not None:
            timer.cancel()

    def _arm(self, loop: asyncio.AbstractEventLoop, asked: float) -> None:
        self._timer = loop.call_at(asked, self._wake, loop, asked)

    def _wake(self, loop: asyncio.AbstractEventLoop, asked: float) -> None:
        now = loop.time()
        self.lag.observe(max(0.0, now - asked))
        self._arm(loop, now + self.interval_s)
