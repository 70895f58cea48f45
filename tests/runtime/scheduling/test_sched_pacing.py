"""Pacing lent prefills and resuming first (issue #34): the pool policies ``pace_prefill_tps``
and ``resume_first``."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from dispatch_support import HandClock, settle, ticket, waiting

from runtime.pool_policies import pool_policy_errors
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Grant, Ticket
from runtime.scheduling.interfaces import QueuedRequest
from runtime.scheduling.ordering import ArrivalOrder, EarliestDeadlineFirst
from runtime.scheduling.pacing import PrefillPacer
from runtime.scheduling.settings import PoolSettings, SettingsError
from runtime.scheduling.takeback import requeued
from runtime.snapshot import EndpointSnap
from runtime.testing.fleet import HandFleet

pytestmark = pytest.mark.unit

FAR = 1e6


def _endpoint(endpoint_id: int) -> EndpointSnap:
    fleet = HandFleet()
    fleet.add(endpoint_id, capacity=4)
    [endpoint] = fleet.candidates(1, frozenset())
    return endpoint


def test_the_pacer_queues_each_endpoints_prefills_and_holds_lent_slots_until_done() -> None:
    pacer = PrefillPacer(1000.0)
    one, two = _endpoint(1), _endpoint(2)
    pacer.sent(1, 500, now=10.0)  # 0.5 s of prefill
    pacer.sent(1, 250, now=10.1)  # after the first: until 10.75
    assert pacer.allowed([one, two], 10.5) == [two]
    assert pacer.next_clear(10.5) == pytest.approx(10.75)
    assert pacer.allowed([one, two], 10.75) == [one, two]
    assert pacer.next_clear(10.75) is None
    off = PrefillPacer()
    off.sent(1, 10_000, now=0.0)
    assert off.allowed([one], 0.0) == [one]  # no pacing: every endpoint, nothing estimated
    assert off.next_clear(0.0) is None
    with pytest.raises(ValueError, match="prefill_tps"):
        PrefillPacer(-1.0)


def test_the_pool_policies_name_the_pace_and_resume_first() -> None:
    settings = PoolSettings.from_policies({"pace_prefill_tps": "2500", "resume_first": "on"}, ())
    assert (settings.pace_prefill_tps, settings.resume_first) == (2500.0, True)
    assert (PoolSettings().pace_prefill_tps, PoolSettings().resume_first) == (0.0, False)
    assert pool_policy_errors({"preemption": "fair", "pace_prefill_tps": "2500",
                               "resume_first": "off"}) == []  # fmt: skip
    for bad in ({"pace_prefill_tps": "-1"}, {"pace_prefill_tps": "fast"},
                {"resume_first": "yes"}):  # fmt: skip
        with pytest.raises(SettingsError):
            PoolSettings.from_policies(bad, ())


def test_a_requeued_request_resuming_first_goes_ahead_of_its_tenants_others() -> None:
    victim = QueuedRequest(id="v", tenant="a", band=2, class_name="batch", input_tokens=300,
                           max_output_tokens=50, seq=1, deadline=500.0)  # fmt: skip
    later = QueuedRequest(id="n", tenant="a", band=0, class_name="chat", input_tokens=10,
                          max_output_tokens=5, seq=9, deadline=100.0)  # fmt: skip
    plain = requeued(victim, resume_first=False)
    assert (plain.band, plain.input_tokens, plain.resumes) == (2, 0, False)
    first = requeued(victim, resume_first=True)
    assert (first.band, first.input_tokens, first.resumes, first.deadline) == (0, 0, True, 500.0)
    assert EarliestDeadlineFirst().less(later, plain)  # by deadline alone it goes later
    assert EarliestDeadlineFirst().less(first, later)
    assert ArrivalOrder().less(first, later)
    assert not ArrivalOrder().less(later, first)


@pytest.mark.asyncio
async def test_lent_slots_go_one_prefill_at_a_time_while_the_pace_allows() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=8)  # two tenants: shares of 4
    clock = HandClock()
    settings = PoolSettings(pace_prefill_tps=100.0)  # a 10-token prompt: 0.1 s
    d = PoolDispatcher("p", settings, fleet, clock=clock, tick_s=3600.0, lend=True)
    d.start()
    grants: list[Grant] = []
    try:
        light = [await d.acquire(ticket("b", deadline_in=FAR)) for _ in range(6)]
        grants = [await d.acquire(ticket("a", deadline_in=FAR)) for _ in range(2)]
        queued = [waiting(d, ticket("a", deadline_in=FAR)) for _ in range(20)]
        await settle()
        clock.now = 10.0  # a floods; the first 8 prompts' prefills are long done
        for grant in light[1:]:  # b keeps one slot: it stays active
            grant.release()
        await settle()
        assert d.held_back().flood_limit == 2
        assert fleet.inflight == {1: 4}  # b 1, a 2 and one lent: its prefill runs until 10.1
        assert d.poke() == pytest.approx(10.1)
        clock.now = 10.05
        assert d.poke() == pytest.approx(10.1)
        assert fleet.inflight == {1: 4}
        clock.now = 10.1
        d.poke()
        await settle()
        assert fleet.inflight == {1: 5}  # the next one, after the first's estimated prefill
        # a tenant within its limit is not paced: b takes a free slot at once
        grants.append(await asyncio.wait_for(d.acquire(ticket("b", deadline_in=FAR)), 1.0))
        assert fleet.inflight == {1: 6}
        grants.append(light[0])
        for task in queued:
            task.cancel()
        await settle()
        grants += [t.result() for t in queued if t.done() and not t.cancelled()]
    finally:
        for grant in grants:
            grant.release()
        await d.stop()


@pytest.mark.asyncio
async def test_a_preempted_request_resuming_first_takes_the_next_slot() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=8)
    clock = HandClock()
    d = PoolDispatcher("p", PoolSettings(preemption="fair", resume_first=True), fleet,
                       clock=clock, tick_s=3600.0)  # fmt: skip
    d.start()

    class Stream:
        def preemptible(self) -> bool:
            return True

        def preempt(self) -> None:
            pass

    try:
        light = [await d.acquire(ticket("b", deadline_in=FAR)) for _ in range(6)]
        # the first flood request is due last: by its deadline it would resume last
        due_last = Ticket(tenant="a", version=1, input_tokens=10, max_output_tokens=10,
                          class_name="standard", deadline=1e12)  # fmt: skip
        flood = [await d.acquire(due_last), await d.acquire(ticket("a", deadline_in=FAR))]
        queued = [waiting(d, ticket("a", deadline_in=FAR)) for _ in range(20)]
        await settle()
        clock.now = 10.0
        for grant in light:
            grant.release()
        await settle()
        lent = flood + [t.result() for t in queued if t.done()]
        for n, grant in enumerate(lent):
            grant.charge_output(10 * (n + 1))  # the first has lost least progress: the victim
            grant.preemptible(Stream())
        arrival = await asyncio.wait_for(d.acquire(ticket("b", deadline_in=FAR)), 1.0)
        victim = flood[0]
        assert victim.parked
        arrival.release()
        await asyncio.wait_for(victim.resumed(), 1.0)  # before the 14 queued requests
        assert sum(t.done() for t in queued) == 6
        for task in queued:
            task.cancel()
        await settle()
        for grant in lent:
            grant.release()
    finally:
        await d.stop()


def _bounded(tenant: str, tokens: int) -> Ticket:
    """A ticket as the gateway makes it without a tokenizer: ``input_tokens`` the byte bound
    (4 bytes a token and 20 of overheads), ``prefill_tokens`` the estimate."""
    return dataclasses.replace(
        ticket(tenant, deadline_in=FAR, tokens=4 * tokens + 20), prefill_tokens=tokens
    )


@pytest.mark.asyncio
async def test_the_pace_counts_the_estimated_prefill_not_the_gateways_byte_bound() -> None:
    """Issue #34's harness finding: the gateway's ``input_tokens`` is an upper bound (bytes,
    ~4x the tokens) when it need not count exactly; paced by it, every request kept its
    endpoint "prefilling" 4x as long and the lent slots almost never went."""
    fleet = HandFleet()
    fleet.add(1, capacity=8)  # two tenants: shares of 4
    clock = HandClock()
    settings = PoolSettings(pace_prefill_tps=100.0)  # 10 tokens: 0.1 s (their bound: 0.6 s)
    d = PoolDispatcher("p", settings, fleet, clock=clock, tick_s=3600.0, lend=True)
    d.start()
    grants: list[Grant] = []
    try:
        light = [await d.acquire(_bounded("b", 10)) for _ in range(6)]
        grants = [await d.acquire(_bounded("a", 10)) for _ in range(2)]
        queued = [waiting(d, _bounded("a", 10)) for _ in range(20)]
        await settle()
        clock.now = 10.0  # a floods; the first 8 prompts' prefills are long done
        for grant in light[1:]:
            grant.release()
        await settle()
        assert fleet.inflight == {1: 4}  # b 1, a 2 and one lent
        assert d.poke() == pytest.approx(10.1)  # its 10 tokens, not its 60-token bound
        clock.now = 10.1
        d.poke()
        await settle()
        assert fleet.inflight == {1: 5}
        grants.append(light[0])
        for task in queued:
            task.cancel()
        await settle()
        grants += [t.result() for t in queued if t.done() and not t.cancelled()]
    finally:
        for grant in grants:
            grant.release()
        await d.stop()


def test_a_ticket_without_an_estimate_paces_by_its_input_tokens() -> None:
    plain = Ticket(tenant="a", version=1, input_tokens=40, max_output_tokens=1)
    assert plain.prefill == 40
    assert dataclasses.replace(plain, prefill_tokens=10).prefill == 10
