"""The LoRA adapters' hold rule: a request for an adapter waits for a replica holding it (and
with a batch slot for it) while its wait is under the pool's typical wait less the load time;
through the dispatcher, only its tenant waits with it."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from dispatch_support import dispatcher, settle, ticket, waiting

from runtime.routing.adapters import AdapterSignal, RecentWaits, adapter_room
from runtime.scheduling.grant import Ticket
from runtime.testing.fleet import HandFleet
from runtime.testing.snapshots import endpoint_snap
from runtime.workers.adapter_loader import AdapterFleet

pytestmark = pytest.mark.unit

E1, E2 = endpoint_snap(1, 1, capacity=4), endpoint_snap(2, 1, capacity=4)


def room(signals: dict[int, AdapterSignal], roomy: tuple[int, ...], waited_s: float) -> list[int]:
    chosen = adapter_room(
        [e for e in (E1, E2) if e.id in roomy], [E1, E2], signals.__getitem__,
        waited_s=waited_s, typical_wait_s=1.0,
    )  # fmt: skip
    return [e.id for e in chosen]


def lora_ticket(tenant: str) -> Ticket:
    return dataclasses.replace(ticket(tenant), adapter="a@v1")


def test_a_request_waits_for_the_replica_holding_its_adapter_then_goes_anywhere() -> None:
    held = {1: AdapterSignal(resident=True, load_s=0.2), 2: AdapterSignal(resident=False)}
    assert room(held, (2,), waited_s=0.0) == []  # the holder is full: wait for it
    assert room(held, (1, 2), waited_s=0.0) == [1]
    assert room(held, (2,), waited_s=0.79) == []
    assert room(held, (2,), waited_s=0.8) == [2]  # typical wait 1.0 less the 0.2 s load
    cold = {1: AdapterSignal(resident=False), 2: AdapterSignal(resident=False)}
    assert room(cold, (1, 2), waited_s=0.0) == [1, 2]  # held nowhere: loads anywhere


def test_a_full_batch_is_waited_out_too() -> None:
    full = {1: AdapterSignal(resident=True, batch_full=True), 2: AdapterSignal(resident=True)}
    assert room(full, (1, 2), waited_s=0.0) == [2]
    both = {1: full[1], 2: AdapterSignal(resident=False, batch_full=True)}
    assert room(both, (1, 2), waited_s=0.0) == []
    assert room(both, (1, 2), waited_s=1.0) == [1, 2]


def test_recent_waits_is_a_windowed_quantile() -> None:
    waits = RecentWaits(window=100, every=10, quantile=0.9)
    for i in range(100):
        waits.add(i / 100)
    assert waits.quantile() == pytest.approx(0.9)
    for _ in range(100):
        waits.add(0.0)  # the window moves on
    assert waits.quantile() == 0.0


@pytest.mark.asyncio
async def test_the_dispatcher_holds_only_that_tenant_and_releases_at_the_typical_wait() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    fleet.add(2, capacity=1)
    book = AdapterFleet(min_residency_s=0)
    book.observe(1, frozenset({"a@v1"}))
    fleet.residency = book
    fleet.inflight[1] = 1  # the replica holding the adapter is full
    d = dispatcher(fleet)
    try:
        d._recent_waits = RecentWaits(every=1)  # the pool typically waits 0.3 s
        d._recent_waits.add(0.3)
        lora = waiting(d, lora_ticket("t1"))
        await settle()
        assert not lora.done()  # it waits for replica 1 instead of loading on 2
        base = await asyncio.wait_for(d.acquire(ticket("t2")), 1.0)
        assert base.endpoint is not None
        assert base.endpoint.id == 2
        fleet.inflight[1] = 0
        d.release(base)  # a slot frees: the pump runs
        grant = await asyncio.wait_for(lora, 1.0)
        assert grant.endpoint is not None
        assert grant.endpoint.id == 1
        late = waiting(d, lora_ticket("t1"))  # replica 1 is full again (the grant above)
        await settle()
        assert not late.done()
        started = asyncio.get_running_loop().time()
        grant = await asyncio.wait_for(late, 2.0)  # past 0.3 s it goes where it must load
        assert grant.endpoint is not None
        assert grant.endpoint.id == 2
        assert asyncio.get_running_loop().time() - started >= 0.25
    finally:
        await d.stop()
