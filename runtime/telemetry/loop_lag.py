"""The event loop's lag: how late a periodic wake-up runs, as a Prometheus histogram.

A task sleeps ``interval_s`` at a time and records how much later than asked it woke up:
the time the loop was busy with other callbacks (or the process had no CPU). Its histogram
``switchyard_event_loop_lag_seconds`` is what the bench scrapes before and after each phase
(``bench/profile.py``): a router that waits rather than computes shows a small lag while its
latency grows; one whose loop stalls shows it here. Cost: one wake-up per interval.
"""

from __future__ import annotations

import asyncio
import contextlib

from prometheus_client import CollectorRegistry, Histogram

LAG_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


class LoopLagProbe:
    """``start()`` in the lifespan, ``stop()`` at shutdown."""

    def __init__(self, registry: CollectorRegistry, *, interval_s: float = 0.05) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be > 0")
        self.interval_s = interval_s
        self.lag = Histogram(
            "switchyard_event_loop_lag_seconds",
            "How late the event loop ran a periodic wake-up (its busy time), per sample.",
            buckets=LAG_BUCKETS,
            registry=registry,
        )
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="loop-lag-probe")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asked = loop.time() + self.interval_s
            await asyncio.sleep(self.interval_s)
            self.lag.observe(max(0.0, loop.time() - asked))
