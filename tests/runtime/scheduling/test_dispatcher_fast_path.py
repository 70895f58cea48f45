"""The dispatcher's fast path: a free slot and an empty queue dispatch inside ``acquire``,
with the queued path's accounting, and never ahead of a request that waits."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
from collections.abc import Callable

import pytest
from dispatch_support import HandFleet, dispatcher, settle, ticket, waiting
from schedsim import make_request

from runtime.scheduling.fairness import VirtualTokenCounter
from runtime.scheduling.grant import Grant, Ticket
from runtime.scheduling.ordering import ArrivalOrder
from runtime.scheduling.queue import PoolQueue

pytestmark = [pytest.mark.unit]


def _resolve_without_suspending(coro: object) -> Grant:
    """Run ``coro`` one step: it must finish without awaiting anything (no hop)."""
    try:
        coro.send(None)  # type: ignore[attr-defined]
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    coro.close()  # type: ignore[attr-defined]
    raise AssertionError("acquire suspended although a slot was free and nothing waited")


@pytest.mark.asyncio
async def test_a_free_slot_and_an_empty_queue_dispatch_without_a_hop() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=2)
    d = dispatcher(fleet)
    try:
        grant = _resolve_without_suspending(d.acquire(ticket("a", tokens=30)))
        assert grant.endpoint is not None
        assert grant.endpoint.id == 1
        assert grant.waited_s == 0.0
        assert fleet.inflight[1] == 1
        assert d.inflight() == {"a": 1}
        assert d.counters()[(0, "a")] > 0  # charged like a queued dispatch
        grant.release()
        assert fleet.inflight[1] == 0
        assert d.inflight() == {}
    finally:
        await d.stop()


@pytest.mark.asyncio
async def test_a_waiting_request_is_never_overtaken_by_the_fast_path() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet)
    try:
        first = await d.acquire(ticket("a"))
        queued = waiting(d, ticket("b"))
        await settle()
        assert not queued.done()
        # Room appears without any event the dispatcher hears (a new endpoint, gauges
        # dropping): the next arrival must not take it ahead of the request that waits.
        fleet.add(2, capacity=1)
        late = waiting(d, ticket("c"))
        await settle()
        assert queued.done(), "the waiting request was not served first"
        granted = queued.result()
        assert granted.endpoint is not None
        assert granted.endpoint.id == 2
        assert not late.done()
        first.release()
        grant_c = await asyncio.wait_for(late, 1)
        assert grant_c.endpoint is not None
        assert grant_c.endpoint.id == 1
        assert grant_c.waited_s >= 0.0
        granted.release()
        grant_c.release()
    finally:
        await d.stop()


@pytest.mark.asyncio
async def test_a_full_pool_still_queues_the_request() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet)
    try:
        first = await d.acquire(ticket("a"))
        second = waiting(d, ticket("a"))
        await settle()
        assert not second.done()
        assert d.queue_lengths() == {0: 1}
        first.release()
        (await asyncio.wait_for(second, 1)).release()
    finally:
        await d.stop()


def test_pass_through_accounts_exactly_like_push_then_pop() -> None:
    ids = itertools.count()
    queued = PoolQueue(fairness=VirtualTokenCounter(), ordering=ArrivalOrder())
    direct = PoolQueue(fairness=VirtualTokenCounter(), ordering=ArrivalOrder())
    for tenant, tokens, weight in [("a", 100, 1.0), ("b", 40, 2.0), ("a", 7, 1.0)]:
        req = make_request(ids, tenant=tenant, input_tokens=tokens, output_tokens=5,
                           weight=weight)  # fmt: skip
        queued.push(req)
        assert queued.pop(lambda r: True) is req
        direct.pass_through(req)
    for tenant in ("a", "b"):
        assert direct.counter(0, tenant) == queued.counter(0, tenant) > 0
    assert direct.deficit(0) == queued.deficit(0)
    assert len(direct) == 0


def test_pass_through_refuses_while_a_request_is_queued() -> None:
    ids = itertools.count()
    queue = PoolQueue(fairness=VirtualTokenCounter(), ordering=ArrivalOrder())
    queue.push(make_request(ids, tenant="a", input_tokens=1, output_tokens=1))
    with pytest.raises(RuntimeError, match="overtake"):
        queue.pass_through(make_request(ids, tenant="b", input_tokens=1, output_tokens=1))


@pytest.mark.asyncio
async def test_on_queued_tells_a_waiting_request_its_position_and_nothing_to_the_fast_path() -> (
    None
):
    """Issue #33's heartbeats: ``Ticket.on_queued`` is called once, only for a request that
    waits, with its live 1-based position (None once it left the queue)."""
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    d = dispatcher(fleet)
    told: dict[str, Callable[[], int | None]] = {}

    def watched(name: str) -> Ticket:  # one tenant: its requests queue in arrival order
        return dataclasses.replace(ticket("t"), on_queued=lambda pos: told.setdefault(name, pos))

    try:
        first = await d.acquire(watched("a"))  # the fast path: never queued
        b = waiting(d, watched("b"))
        c = waiting(d, watched("c"))
        await settle()
        assert set(told) == {"b", "c"}  # "a" went straight to the free slot
        assert (told["b"](), told["c"]()) == (1, 2)
        first.release()
        granted = await asyncio.wait_for(b, 1)
        assert told["b"]() is None  # left the queue
        assert told["c"]() == 1
        granted.release()
        (await asyncio.wait_for(c, 1)).release()
    finally:
        await d.stop()
