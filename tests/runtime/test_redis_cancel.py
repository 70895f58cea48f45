"""cancel_and_wait / raise_if_cancelling: a polling loop whose read swallows a cancellation
(as redis-py's PubSub.get_message with a timeout can) still stops, and its owner never hangs."""

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


async def test_a_loop_that_never_checks_is_given_up_on_within_the_bound() -> None:
    stop = asyncio.Event()

    async def poll() -> None:
        while not stop.is_set():
            await _swallowing_read()  # swallows every cancellation and never checks

    task = asyncio.create_task(poll())
    loop = asyncio.get_running_loop()
    started = loop.time()
    assert not await cancel_and_wait(task, attempts=3, wait_s=0.1)
    assert loop.time() - started < 2.0  # bounded: the owner does not hang
    assert not task.done()
    stop.set()
    await asyncio.wait_for(task, timeout=2)
