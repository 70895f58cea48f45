"""Scale from zero in the dispatcher: a request for a version with no ready replica waits in the
queue while one starts if its deadline covers the measured start time, else 503 + Retry-After."""

from __future__ import annotations

import asyncio

import pytest
from dispatch_support import HandFleet, settle, ticket

from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import NoEndpointError, QueueDropError
from runtime.scheduling.interfaces import DropReason
from runtime.scheduling.settings import PoolSettings

pytestmark = pytest.mark.unit

pytestmark = pytest.mark.asyncio


def make(fleet: HandFleet, starts: dict[int, float]) -> PoolDispatcher:
    loop = asyncio.get_running_loop()
    d = PoolDispatcher("p", PoolSettings(), fleet, clock=loop.time, tick_s=0.01,  # type: ignore[arg-type]
                       cold_start=starts.get)  # fmt: skip
    d.start()
    return d


async def test_held_while_a_replica_starts_then_served() -> None:
    fleet = HandFleet()
    d = make(fleet, {1: 2.0})
    try:
        task = asyncio.get_running_loop().create_task(d.acquire(ticket(deadline_in=30)))
        await settle()
        assert not task.done()
        assert d.queue_lengths() == {0: 1}
        await asyncio.sleep(0.05)  # several ticks with no endpoint: still held, not stranded
        assert not task.done()
        fleet.add(7)  # the replica is ready
        d._wake.set()
        grant = await asyncio.wait_for(task, 2)
        assert grant.endpoint is not None
        assert grant.endpoint.id == 7
        grant.release()
    finally:
        await d.stop()


async def test_deadline_shorter_than_the_start_is_refused_with_retry_after() -> None:
    d = make(HandFleet(), {1: 12.3})
    try:
        with pytest.raises(NoEndpointError, match=r"takes about 12\.3 s") as info:
            await d.acquire(ticket(deadline_in=5))
        assert info.value.retry_after_s == 13
    finally:
        await d.stop()


async def test_without_scale_from_zero_no_endpoint_is_refused_at_once() -> None:
    d = make(HandFleet(), {})
    try:
        with pytest.raises(NoEndpointError) as info:
            await d.acquire(ticket(version=2))
        assert info.value.retry_after_s is None
    finally:
        await d.stop()


async def test_a_held_request_whose_replica_never_comes_expires_at_its_deadline() -> None:
    d = make(HandFleet(), {1: 0.05})
    try:
        with pytest.raises(QueueDropError) as info:
            await asyncio.wait_for(d.acquire(ticket(deadline_in=0.2)), 2)
        assert info.value.reason is DropReason.DEADLINE_EXPIRED
    finally:
        await d.stop()
