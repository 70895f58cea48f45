"""Lending (issue #34): the flood limit lends idle slots, keeping ``lend_reserve`` of them free."""

from __future__ import annotations

import pytest
from dispatch_support import HandClock, settle, ticket, waiting

from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.settings import PoolSettings
from runtime.testing.fleet import HandFleet

pytestmark = pytest.mark.unit

FAR = 1e6  # deadlines: the hand clock starts at 0


@pytest.mark.asyncio
@pytest.mark.parametrize(
    ("lend", "reserve", "flood_holds"),
    [
        (False, 0, 2),  # the flood limit alone: 8 - b's remembered peak of 6
        (True, 0, 8),  # lending every idle slot
        (True, 3, 5),  # lending while more than 3 are free
        (True, 8, 2),  # a reserve of the whole pool lends nothing
    ],
)
async def test_lending_keeps_the_reserve_free(lend: bool, reserve: int, flood_holds: int) -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=8)  # two tenants: shares of 4
    clock = HandClock()
    d = PoolDispatcher("p", PoolSettings(), fleet, clock=clock, tick_s=3600.0, lend=lend,
                       lend_reserve=reserve)  # fmt: skip
    d.start()
    try:
        light = [await d.acquire(ticket("b", deadline_in=FAR)) for _ in range(6)]
        flood = [await d.acquire(ticket("a", deadline_in=FAR)) for _ in range(2)]
        queued = [waiting(d, ticket("a", deadline_in=FAR)) for _ in range(20)]
        await settle()
        clock.now = 10.0  # a has asked for five shares on average since: it floods
        for grant in light:
            grant.release()
        await settle()
        assert d.held_back().flood_limit == 2
        assert fleet.inflight == {1: flood_holds}
        if flood_holds < 8:  # a reserved slot: b takes it at once, no preemption needed
            (await d.acquire(ticket("b", deadline_in=FAR))).release()
        for task in queued:
            task.cancel()
        await settle()
        for grant in [*flood, *(t.result() for t in queued if t.done() and not t.cancelled())]:
            grant.release()
    finally:
        await d.stop()


def test_a_negative_reserve_is_refused() -> None:
    with pytest.raises(ValueError, match="lend_reserve must be >= 0"):
        PoolDispatcher("p", PoolSettings(), HandFleet(), clock=HandClock(), lend_reserve=-1)
