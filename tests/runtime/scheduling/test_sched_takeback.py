"""Taking lent slots back (issue #34): with a pool ``preemption`` policy the dispatcher lends
idle slots to a flooder and, when a tenant the gate lets through arrives to a full pool,
stops one of the flooder's offered streams, gives its slot to the arrival at once and queues
the victim again with its place, deadline and fairness charge."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from dispatch_support import HandClock, settle, ticket, waiting

from runtime.pool_policies import pool_policy_errors
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Grant, QueueDropError, Ticket
from runtime.scheduling.interfaces import DropReason
from runtime.scheduling.settings import PoolSettings, SettingsError
from runtime.scheduling.takeback import MAX_PREEMPTIONS
from runtime.testing.fleet import HandFleet

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]

FAR = 1e6


class Stream:
    """A running stream as the take-back sees it (what the gateway's MigratingStream is)."""

    def __init__(self) -> None:
        self.stopped = 0
        self.live = True

    def preemptible(self) -> bool:
        return self.live

    def preempt(self) -> None:
        self.stopped += 1
        self.live = False


class Flooded:
    """8 slots; ``a`` floods and, lent, holds all 8 with offered streams; 20 more queued."""

    def __init__(self, preemption: str = "fair") -> None:
        self.fleet = HandFleet()
        self.fleet.add(1, capacity=8)
        self.clock = HandClock()
        self.d = PoolDispatcher("p", PoolSettings(preemption=preemption), self.fleet,
                                clock=self.clock, tick_s=3600.0)  # fmt: skip
        self.streams: dict[int, Stream] = {}

    async def flood(self, first_deadline: float = FAR) -> list[Grant]:
        d = self.d
        d.start()
        light = [await d.acquire(ticket("b", deadline_in=FAR)) for _ in range(6)]
        first = Ticket(tenant="a", version=1, input_tokens=10, max_output_tokens=10,
                       class_name="standard", deadline=first_deadline)  # fmt: skip
        flood = [await d.acquire(first), await d.acquire(ticket("a", deadline_in=FAR))]
        self.queued = [waiting(d, ticket("a", deadline_in=FAR)) for _ in range(20)]
        await settle()
        self.clock.now = 10.0  # a has asked for five shares on average since: it floods
        for grant in light:
            grant.release()
        await settle()
        grants = flood + [t.result() for t in self.queued if t.done()]
        assert self.fleet.inflight == {1: 8}  # lending every idle slot
        for n, grant in enumerate(grants):
            grant.charge_output(10 * (n + 1))  # the first one has lost least progress
            self.streams[id(grant)] = stream = Stream()
            grant.preemptible(stream)
        return grants

    async def close(self) -> None:
        for task in self.queued:
            task.cancel()
        await settle()
        await self.d.stop()


async def test_an_arrival_under_its_share_takes_a_lent_slot_at_once() -> None:
    pool = Flooded()
    try:
        grants = await pool.flood()
        counter = pool.d.counters()[0, "a"]
        arrival = await asyncio.wait_for(pool.d.acquire(ticket("b", deadline_in=FAR)), 1.0)
        victim = grants[0]  # fair: least progress lost (prompt + generated)
        assert pool.streams[id(victim)].stopped == 1
        assert [g for g in grants if pool.streams[id(g)].stopped] == [victim]
        assert victim.parked
        assert victim.endpoint is None
        assert victim.preemptions == 1
        assert pool.fleet.inflight == {1: 8}
        assert pool.d.inflight() == {"a": 7, "b": 1}
        assert pool.d.outcomes["preempted"] == 1
        # b leaves: the victim resumes first (its place kept), with no second charge
        arrival.release()
        endpoint = await asyncio.wait_for(victim.resumed(), 1.0)
        assert endpoint.id == 1
        assert not victim.parked
        assert sum(t.done() for t in pool.queued) == 6  # the 14 later requests still wait
        assert pool.d.counters()[0, "a"] == counter
        victim.release()
        assert pool.d.inflight() == {"a": 8}  # lent again: nobody else waits
    finally:
        await pool.close()


async def test_without_a_preemption_policy_the_arrival_waits() -> None:
    pool = Flooded(preemption="off")
    pool.d = PoolDispatcher("p", PoolSettings(), pool.fleet, clock=pool.clock, tick_s=3600.0,
                            lend=True)  # fmt: skip
    try:
        grants = await pool.flood()
        arrival = waiting(pool.d, ticket("b", deadline_in=FAR))
        await settle()
        assert not arrival.done()
        assert not any(s.stopped for s in pool.streams.values())
        grants[0].release()
        await asyncio.wait_for(arrival, 1.0)
        arrival.result().release()
    finally:
        await pool.close()


async def test_the_flooder_arriving_preempts_nobody() -> None:
    pool = Flooded()
    try:
        await pool.flood()
        more = waiting(pool.d, ticket("a", deadline_in=FAR))
        await settle()
        assert not more.done()
        assert not any(s.stopped for s in pool.streams.values())
        more.cancel()
    finally:
        await pool.close()


async def test_a_parked_grant_released_leaves_the_queue_and_frees_nothing() -> None:
    pool = Flooded()
    try:
        grants = await pool.flood()
        arrival = await pool.d.acquire(ticket("b", deadline_in=FAR))
        queued = len(pool.d)
        grants[0].release()  # the client went away while it waited to resume
        assert len(pool.d) == queued - 1
        assert pool.d.inflight() == {"a": 7, "b": 1}
        assert pool.fleet.inflight == {1: 8}
        grants[0].release()  # idempotent
        arrival.release()
        assert pool.d.inflight() == {"a": 8}  # the next queued request of a took it
    finally:
        await pool.close()


async def test_a_parked_request_whose_deadline_passes_is_dropped() -> None:
    pool = Flooded()
    try:
        grants = await pool.flood(first_deadline=15.0)  # on the hand clock (now 10)
        victim = grants[0]
        await pool.d.acquire(ticket("b", deadline_in=FAR))
        assert victim.parked
        pool.clock.now = 20.0
        grants[1].release()  # any pump expires it
        with pytest.raises(QueueDropError) as caught:
            await asyncio.wait_for(victim.resumed(), 1.0)
        assert caught.value.reason == DropReason.DEADLINE_EXPIRED
        assert pool.d.outcomes[str(DropReason.DEADLINE_EXPIRED)] == 1
        victim.release()
        assert pool.d.inflight() == {"a": 7, "b": 1}
    finally:
        await pool.close()


async def test_a_stream_is_preempted_at_most_max_preemptions_times() -> None:
    pool = Flooded()
    try:
        grants = await pool.flood()
        victim = grants[0]
        for round_ in range(MAX_PREEMPTIONS + 1):
            arrival = await pool.d.acquire(ticket("b", deadline_in=FAR))
            stopped = pool.streams[id(victim)].stopped
            assert stopped == min(round_ + 1, MAX_PREEMPTIONS)
            arrival.release()
            if stopped == round_ + 1:  # preempted this round: it resumes, and offers again
                await asyncio.wait_for(victim.resumed(), 1.0)
                pool.streams[id(victim)].live = True
                victim.preemptible(pool.streams[id(victim)])
    finally:
        await pool.close()


async def test_the_pool_policies_name_the_victim_policy_and_the_reserve() -> None:
    settings = PoolSettings.from_policies({"preemption": "fair", "lend_reserve": "3"}, ())
    assert (settings.preemption, settings.lend_reserve) == ("fair", 3)
    d = PoolDispatcher("p", settings, HandFleet(), clock=HandClock())
    assert d.takes_back
    d.update(PoolSettings())  # a snapshot turns it off: nothing is lent any more
    assert not d.takes_back
    assert pool_policy_errors({"preemption": "fair", "lend_reserve": "2"}) == []
    assert pool_policy_errors({"preemption": "most_generated"})
    with pytest.raises(SettingsError):
        PoolSettings.from_policies({"lend_reserve": "-1"}, ())


async def test_the_victim_choice_counts_the_estimated_prefill_not_the_byte_bound() -> None:
    """The resume cost is the prompt's estimated tokens plus those generated: with the
    gateway's byte bound (~4x the tokens, issue #34) generated tokens counted a quarter of
    what they cost, and the dearer stream to resume was stopped."""
    pool = Flooded()
    d = pool.d

    def bounded(tokens: int) -> Ticket:
        return dataclasses.replace(ticket("a", deadline_in=FAR, tokens=4 * tokens + 20),
                                   prefill_tokens=tokens)  # fmt: skip

    d.start()
    grants: list[Grant] = []
    try:
        light = [await d.acquire(ticket("b", deadline_in=FAR)) for _ in range(6)]
        short_prompt, long_prompt = await d.acquire(bounded(100)), await d.acquire(bounded(200))
        pool.queued = [waiting(d, bounded(1000)) for _ in range(20)]
        await settle()
        pool.clock.now = 10.0
        for grant in light:
            grant.release()
        await settle()
        assert pool.fleet.inflight == {1: 8}
        short_prompt.charge_output(200)  # resuming it: 100 + 200 tokens (bound: 420 + 200)
        streams = {id(g): Stream() for g in (short_prompt, long_prompt)}  # 200 (bound: 820)
        for g in (short_prompt, long_prompt):
            g.preemptible(streams[id(g)])
        arrival = await asyncio.wait_for(d.acquire(ticket("b", deadline_in=FAR)), 1.0)
        grants.append(arrival)
        assert streams[id(long_prompt)].stopped == 1
        assert streams[id(short_prompt)].stopped == 0
    finally:
        for grant in grants:
            grant.release()
        await pool.close()
