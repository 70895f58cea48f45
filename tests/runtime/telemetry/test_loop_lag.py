"""The loop-lag probe records how long the loop was blocked."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import CollectorRegistry

from runtime.telemetry.loop_lag import LoopLagProbe

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


async def test_a_blocked_loop_shows_as_lag_and_stop_ends_the_probe() -> None:
    registry = CollectorRegistry()
    probe = LoopLagProbe(registry, interval_s=0.01)
    probe.start()
    try:
        await asyncio.sleep(0.05)  # a few quiet samples
        time.sleep(0.3)  # noqa: ASYNC251 - the stall under test
        for _ in range(100):  # bounded: the probe observes the stall on its next wake-up
            if sample(registry, "switchyard_event_loop_lag_seconds_bucket", le="0.2") < sample(
                registry, "switchyard_event_loop_lag_seconds_count"
            ):
                break
            await asyncio.sleep(0.01)
    finally:
        await probe.stop()
    count = sample(registry, "switchyard_event_loop_lag_seconds_count")
    assert count >= 2
    over = count - sample(registry, "switchyard_event_loop_lag_seconds_bucket", le="0.2")
    assert over >= 1  # the 0.3 s stall
    assert sample(registry, "switchyard_event_loop_lag_seconds_sum") >= 0.25
    await asyncio.sleep(0.05)
    assert sample(registry, "switchyard_event_loop_lag_seconds_count") == count  # stopped
