"""PoolDispatcher: release only with room, order, cancellation, expiry, versions, headroom."""

from __future__ import annotations

import asyncio

import pytest
from dispatch_support import HandFleet, dispatcher, settle, ticket, waiting

from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import (
    NoEndpointError,
    QueueDropError,
    QueueRejectedError,
)
from runtime.scheduling.interfaces import DropReason, EndpointLoad
from runtime.scheduling.settings import PoolSettings

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]


async def test_releases_only_while_the_endpoint_has_room_and_a_release_wakes_the_next() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=2)
    d = dispatcher(fleet)
    try:
        first = await d.acquire(ticket("a"))
        second = await d.acquire(ticket("a"))
        assert fleet.inflight[1] == 2
        third = waiting(d, ticket("a"))
        await settle()
        assert not third.done()
        assert d.queue_lengths() == {0: 1}
        first.release()
        first.release()  # idempotent
        grant = await asyncio.wait_for(third, 1)
        assert grant.endpoint is not None
        assert grant.endpoint.id == 1
        assert grant.waited_s > 0
        assert fleet.inflight[1] == 2
        second.release()
        grant.release()
        assert fleet.inflight[1] == 0
    finally:
        await d.stop()


@pytest.mark.parametrize(
    ("load", "room"),
    [
        (EndpointLoad(kv_usage=0.95, waiting=0, age_s=0.1), False),
        (EndpointLoad(kv_usage=0.2, waiting=2, age_s=0.1), False),
        (EndpointLoad(kv_usage=0.95, waiting=3, age_s=5.0), True),  # stale: in-flight decides
        (EndpointLoad(kv_usage=0.5, waiting=0, age_s=0.1), True),
    ],
)
async def test_scraped_kv_use_and_waiting_requests_hold_requests_back(
    load: EndpointLoad, room: bool
) -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=8)
    fleet.loads[1] = load
    d = dispatcher(fleet)
    try:
        task = waiting(d, ticket())
        await settle()
        assert task.done() is room
        if not room:
            fleet.loads[1] = EndpointLoad(kv_usage=0.1, waiting=0, age_s=0.0)  # next scrape
            grant = await asyncio.wait_for(task, 1)  # picked up by the loop's tick
            grant.release()
        else:
            task.result().release()
    finally:
        await d.stop()


async def test_more_urgent_bands_go_first() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet)
    try:
        busy = await d.acquire(ticket())
        batch = waiting(d, ticket("a", band=2))
        await settle()
        urgent = waiting(d, ticket("b", band=0))
        await settle()
        busy.release()
        await settle()
        assert urgent.done()
        assert not batch.done()
        urgent.result().release()
        (await asyncio.wait_for(batch, 1)).release()
    finally:
        await d.stop()


@pytest.mark.parametrize(("fairness", "b_position"), [("vtc", 1), ("fcfs", 3)])
async def test_fairness_decides_between_tenants_of_a_band(fairness: str, b_position: int) -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    # No headroom: tenant a, four requests for one slot, would flood (module headroom), and
    # this is about the fairness policy's order alone.
    d = dispatcher(fleet, fairness=fairness, headroom=0.0)
    try:
        busy = await d.acquire(ticket("a"))
        order: list[str] = []
        tasks = [waiting(d, ticket("a")) for _ in range(3)]
        await settle()
        tasks.append(waiting(d, ticket("b")))
        await settle()
        held = busy
        for _ in range(4):
            held.release()
            await settle()
            done = [t for t in tasks if t.done() and t not in order]
            assert len(done) == 1
            order.append(done[0])  # type: ignore[arg-type]
            held = done[0].result()
        held.release()
        # VTC: b joins level with a (it banks nothing) and goes after a's tie-winning head.
        assert order.index(tasks[3]) == b_position  # type: ignore[arg-type]
    finally:
        await d.stop()


async def test_a_cancelled_waiter_leaves_the_queue_at_once() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet)
    try:
        busy = await d.acquire(ticket())
        task = waiting(d, ticket("b"))
        await settle()
        assert len(d) == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(d) == 0
        assert d.queue_lengths() == {}
        busy.release()
        assert fleet.inflight[1] == 0  # nobody took the slot
    finally:
        await d.stop()


async def test_a_queued_request_whose_deadline_passes_is_dropped_before_dispatch() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet)
    try:
        busy = await d.acquire(ticket())
        loop = asyncio.get_running_loop()
        started = loop.time()
        with pytest.raises(QueueDropError) as caught:
            await asyncio.wait_for(d.acquire(ticket("b", deadline_in=0.1)), 2)
        assert caught.value.reason is DropReason.DEADLINE_EXPIRED
        assert "before dispatch" in str(caught.value)
        assert 0.08 <= loop.time() - started < 0.5
        assert len(d) == 0
        busy.release()
    finally:
        await d.stop()


async def test_a_head_whose_version_is_full_does_not_block_other_versions() -> None:
    fleet = HandFleet()
    fleet.add(1, version=1, capacity=1)
    fleet.add(2, version=2, capacity=1)
    d = dispatcher(fleet, fairness="fcfs")
    try:
        busy = await d.acquire(ticket("a", version=1))
        blocked = waiting(d, ticket("a", version=1))  # oldest head, no room for version 1
        await settle()
        other = await asyncio.wait_for(d.acquire(ticket("b", version=2)), 1)
        assert other.endpoint is not None
        assert other.endpoint.id == 2
        assert not blocked.done()
        busy.release()
        (await asyncio.wait_for(blocked, 1)).release()
        other.release()
    finally:
        await d.stop()


async def test_a_wait_beyond_the_deadline_is_refused_at_once_with_position() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet, ordering="fcfs")  # (EDF would put the short deadline first)
    try:
        busy = await d.acquire(ticket())
        queued = [waiting(d, ticket("a", tokens=2000, output=1000)) for _ in range(3)]
        await settle()
        # Work ahead ~12,000 token-cost units at the prior 1,000/s: ~12 s > 1 s.
        with pytest.raises(QueueRejectedError) as caught:
            await d.acquire(ticket("a", deadline_in=1.0))
        rejection = caught.value.rejection
        assert rejection.reason is DropReason.WAIT_EXCEEDS_DEADLINE
        assert rejection.position == 4
        assert rejection.estimated_wait_s > 1.0
        assert rejection.retry_after_s >= 12
        for task in queued:
            task.cancel()
        busy.release()
    finally:
        await d.stop()


async def test_a_full_band_refuses_and_the_pool_bound_sheds_the_most_sheddable() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet, band_limits={2: 1}, max_total=2)
    try:
        busy = await d.acquire(ticket())
        batch = waiting(d, ticket("a", band=2, shed_order=0, class_name="batch"))
        await settle()
        with pytest.raises(QueueRejectedError) as full:
            await d.acquire(ticket("a", band=2, shed_order=0))
        assert full.value.rejection.reason is DropReason.QUEUE_FULL
        standard = waiting(d, ticket("b", band=1, shed_order=1))
        await settle()
        interactive = waiting(d, ticket("c", band=0, shed_order=2))  # pool full: batch goes
        await settle()
        with pytest.raises(QueueDropError) as shed:
            await batch
        assert shed.value.reason is DropReason.SHED
        assert shed.value.retry_after_s >= 1
        assert not standard.done()
        assert not interactive.done()
        for task in (standard, interactive):
            task.cancel()
        busy.release()
    finally:
        await d.stop()


async def test_no_usable_endpoint_is_a_503_now_and_for_those_already_queued() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet)
    try:
        with pytest.raises(NoEndpointError):
            await d.acquire(ticket(version=7))
        busy = await d.acquire(ticket())
        task = waiting(d, ticket("b"))
        await settle()
        fleet.down.add(1)
        with pytest.raises(NoEndpointError):
            await asyncio.wait_for(task, 1)
        busy.release()
    finally:
        await d.stop()


@pytest.mark.parametrize(("fairness", "b_waits"), [("vtc", False), ("fcfs", True)])
async def test_headroom_keeps_a_slot_for_a_tenant_below_its_share(
    fairness: str, b_waits: bool
) -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=4)
    d = dispatcher(fleet, fairness=fairness)
    try:
        b_first = await d.acquire(ticket("b"))  # b is active: its share is 2 of 4 slots
        b_first.release()
        flood = [waiting(d, ticket("a")) for _ in range(6)]
        await settle()
        granted = [t for t in flood if t.done()]
        # vtc: one slot (b's peak demand, and a quarter of 4) is kept for b.
        assert len(granted) == (4 if b_waits else 3)
        light = waiting(d, ticket("b"))
        await settle()
        assert light.done() is not b_waits
        for task in [*flood, light]:
            if task.done():
                task.result().release()
            else:
                task.cancel()
    finally:
        await d.stop()


async def test_a_tenant_past_its_share_yields_to_the_others_whatever_the_band() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=9)  # three tenants: shares of 3
    d = dispatcher(fleet)
    try:
        held = [await d.acquire(ticket("c"))]
        held += [await d.acquire(ticket("b")) for _ in range(3)]
        flood = [await d.acquire(ticket("a")) for _ in range(5)]  # a: past its share
        urgent = waiting(d, ticket("a", band=0))
        batch = waiting(d, ticket("b", band=2))
        await settle()
        assert not urgent.done()
        assert not batch.done()
        flood.pop().release()  # a still holds 4, past its share, below its limit (9 - 4)
        await settle()
        # Strict band order would send a's band-0 request; a past its share yields instead.
        assert batch.done()
        assert not urgent.done()
        urgent.cancel()
        for grant in [*held, *flood, batch.result()]:
            grant.release()
    finally:
        await d.stop()


class HandClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def test_a_flooding_tenant_waits_while_the_others_recent_peak_keeps_slots_free() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=8)  # two tenants: shares of 4
    clock = HandClock()
    d = PoolDispatcher("p", PoolSettings(), fleet, clock=clock, tick_s=3600.0)
    d.start()
    far = 1e6  # deadlines: the hand clock starts at 0
    try:
        light = [await d.acquire(ticket("b", deadline_in=far)) for _ in range(6)]
        flood = [await d.acquire(ticket("a", deadline_in=far)) for _ in range(2)]
        queued = [waiting(d, ticket("a", deadline_in=far)) for _ in range(20)]
        await settle()
        clock.now = 10.0  # a has asked for 22 slots, five shares, on average since
        for grant in light:
            grant.release()
        await settle()
        # b's peak (6) is remembered: a, flooding, may hold 8 - 6 = 2; six slots stay free.
        assert not any(task.done() for task in queued)
        assert fleet.inflight == {1: 2}
        held = d.held_back()  # what /metrics shows
        assert held.flooders == frozenset({"a"})
        assert held.flood_limit == 2
        again = await d.acquire(ticket("b", deadline_in=far))  # b finds its room at once
        clock.now = 80.0  # b's peak is forgotten (and b is no longer active: a is alone)
        again.release()
        await settle()
        assert sum(task.done() for task in queued) == 8 - 2
        for task in queued:
            task.cancel()
        for grant in [*flood, *(t.result() for t in queued if t.done() and not t.cancelled())]:
            grant.release()
    finally:
        await d.stop()


async def test_reassign_moves_to_another_endpoint_with_room_else_the_fallback() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    fleet.add(2, capacity=1)
    d = dispatcher(fleet)
    try:
        grant = await d.acquire(ticket())
        assert grant.endpoint is not None
        first = grant.endpoint.id
        other = 2 if first == 1 else 1
        moved = grant.reassign(frozenset({first}))
        assert moved is not None
        assert moved.id == other
        assert fleet.inflight == {first: 0, other: 1}
        filler = await d.acquire(ticket())  # takes the freed endpoint
        fallback = grant.reassign(frozenset({other}))  # no room anywhere: routing's choice
        assert fallback is not None
        assert fallback.id == first
        assert fleet.inflight == {first: 2, other: 0}
        assert grant.reassign(frozenset({1, 2})) is None  # nothing left to try
        assert fleet.inflight == {first: 1, other: 0}
        grant.release()
        filler.release()
    finally:
        await d.stop()


async def test_output_tokens_charge_the_tenant_and_the_usage_settles_the_rest() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet)
    try:
        grant = await d.acquire(ticket("a", tokens=10, output=100))
        assert d.counters() == {(0, "a"): 10.0}
        grant.charge_output(5)
        grant.charge_output(5)
        assert d.counters() == {(0, "a"): 30.0}
        grant.settle_output(12)
        assert d.counters() == {(0, "a"): 34.0}
        grant.settle_output(3)  # counters never fall
        assert d.counters() == {(0, "a"): 34.0}
        assert d.served.totals() == {"a": (10, 12)}
        grant.release()
    finally:
        await d.stop()


async def test_new_settings_rebuild_the_queue_without_losing_requests_or_counters() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet, fairness="vtc")
    try:
        busy = await d.acquire(ticket("a"))
        queued = [waiting(d, ticket(t)) for t in ("a", "b")]
        await settle()
        d.update(PoolSettings(fairness="fcfs", max_total=10))
        assert d.settings.fairness == "fcfs"
        assert d.counters()[(0, "a")] == 10.0
        assert len(d) == 2
        busy.release()
        await settle()
        assert queued[0].done()  # fcfs now: the oldest goes first
        queued[0].result().release()
        (await asyncio.wait_for(queued[1], 1)).release()
    finally:
        await d.stop()


async def test_stop_answers_every_waiting_request() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet)
    busy = await d.acquire(ticket())
    task = waiting(d, ticket("b"))
    await settle()
    await d.stop()
    with pytest.raises(NoEndpointError):
        await task
    busy.release()
    with pytest.raises(NoEndpointError):
        await d.acquire(ticket())


async def test_over_quota_requests_are_shed_before_newer_ones_within_quota() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet, max_total=6)
    try:
        busy = await d.acquire(ticket("z"))
        tasks: dict[str, asyncio.Task[object]] = {}
        # a's fourth request is over its quota: 3 queued >= 6 * 1/2 (two tenants queued).
        for name, tenant in [("a1", "a"), ("a2", "a"), ("b1", "b"), ("a3", "a"), ("a4", "a"),
                             ("b2", "b")]:  # fmt: skip
            tasks[name] = waiting(d, ticket(tenant))  # type: ignore[assignment]
            await settle()
        assert not any(task.done() for task in tasks.values())
        tasks["c1"] = waiting(d, ticket("c"))  # type: ignore[assignment]
        await settle()
        with pytest.raises(QueueDropError) as shed:
            await tasks["a4"]
        assert shed.value.reason is DropReason.SHED
        assert not tasks["b2"].done()  # the newest, but within quota
        for task in tasks.values():
            task.cancel()
        busy.release()
    finally:
        await d.stop()
