"""cancel_and_wait / raise_if_cancelling: a polling loop whose read swallows a cancellation
(as redis-py's PubSub.get_message with a timeout can) still stops when its owner cancels it."""

from __future__ import annotations

import asyncio

import pytest

from runtime.redis_conn import cancel_and_wait, raise_if_cancelling

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]


async def _swallowing_read() -> None:
    """A read that turns a cancellation into a plain timeout, like redis-py may."""
    try:
        await asyncio.sleep(0.05)
    except asyncio.CancelledError:
        return


async def test_a_loop_that_checks_stops_at_the_first_cancellation() -> None:
    reads = 0

    async def poll() -> None:
        nonlocal reads
        while True:
            await _swallowing_read()
            reads += 1
            raise_if_cancelling()

    task = asyncio.create_task(poll())
    await asyncio.sleep(0.12)
    assert await cancel_and_wait(task, attempts=3, wait_s=0.5)
    assert task.cancelled()
    assert reads >= 1
