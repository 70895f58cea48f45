"""PeriodicFlusher: the timer and connection around a batch's flush."""

from __future__ import annotations

import asyncio

import pytest
from fixtures.wait import async_eventually

from runtime.flusher import PeriodicFlusher

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]


class Counting(PeriodicFlusher):
    def __init__(self, interval_s: float) -> None:
        super().__init__("redis://127.0.0.1:1/0", interval_s=interval_s, name="test-flusher")
        self.flushes = 0

    async def flush(self) -> int:
        self.flushes += 1
        return 0


async def test_flushes_on_its_timer_and_once_more_at_stop() -> None:
    flusher = Counting(interval_s=0.01)
    await flusher.start()
    try:
        with pytest.raises(RuntimeError, match="Counting already started"):
            await flusher.start()
        await async_eventually(lambda: flusher.flushes >= 3, timeout=5, what="three flushes")
    finally:
        await flusher.stop()
    after_stop = flusher.flushes
    assert flusher._task is None
    assert flusher._client is None
    await flusher.stop()  # stopping twice only flushes again
    assert flusher.flushes == after_stop + 1


class Slow(PeriodicFlusher):
    """A flush that waits for ``release``: stop must let it finish, not cancel it."""

    def __init__(self) -> None:
        super().__init__("redis://127.0.0.1:1/0", interval_s=0.01, name="test-flusher")
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.finished = 0

    async def flush(self) -> int:
        self.started.set()
        await self.release.wait()
        self.finished += 1
        return 1


async def test_stop_during_a_flush_lets_it_finish() -> None:
    flusher = Slow()
    await flusher.start()
    await asyncio.wait_for(flusher.started.wait(), timeout=5)  # the timer's flush is running
    stopping = asyncio.create_task(flusher.stop())
    await asyncio.sleep(0)
    assert not stopping.done()
    flusher.release.set()
    await asyncio.wait_for(stopping, timeout=5)
    assert flusher.finished == 2  # the timer's flush, not cancelled, and the one at stop


async def test_a_timer_that_never_ticks_is_refused() -> None:
    with pytest.raises(ValueError, match="interval_s"):
        Counting(interval_s=0)
