"""Which lent prefills go where (issue #34): the pool policies ``lend_max_prefill``,
``lend_exclusive`` and ``lend_steer`` (:mod:`runtime.scheduling.lent_prefill`)."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from dispatch_support import HandClock, Stream, granted, settle, ticket, waiting
from schedsim import make_request

from runtime.pool_policies import pool_policy_errors
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Grant, Ticket
from runtime.scheduling.interfaces import QueuedRequest
from runtime.scheduling.lent_prefill import LentPrefillRule
from runtime.scheduling.ordering import ArrivalOrder
from runtime.scheduling.pacing import PrefillPacer
from runtime.scheduling.queue import PoolQueue
from runtime.scheduling.registry import fairness_policy
from runtime.scheduling.settings import PoolSettings, SettingsError
from runtime.snapshot import EndpointSnap
from runtime.testing.fleet import HandFleet

pytestmark = pytest.mark.unit

FAR = 1e6


def _endpoints(*ids: int) -> list[EndpointSnap]:
    fleet = HandFleet()
    for endpoint_id in ids:
        fleet.add(endpoint_id, capacity=4)
    return list(fleet.candidates(1, frozenset()))


def test_the_pool_policies_name_the_lent_prefill_rules_off_by_default() -> None:
    settings = PoolSettings.from_policies(
        {"lend_max_prefill": "256", "lend_exclusive": "on", "lend_steer": "on"}, ()
    )
    assert settings.lent_prefill() == LentPrefillRule(max_tokens=256, exclusive=True, steer=True)
    assert PoolSettings().lent_prefill() == LentPrefillRule()
    assert pool_policy_errors({"preemption": "fair", "lend_max_prefill": "128",
                               "lend_exclusive": "off", "lend_steer": "on"}) == []  # fmt: skip
    for bad in ({"lend_max_prefill": "-1"}, {"lend_max_prefill": "short"},
                {"lend_exclusive": "yes"}, {"lend_steer": "1"}):  # fmt: skip
        with pytest.raises(SettingsError):
            PoolSettings.from_policies(bad, ())
    with pytest.raises(ValueError, match="max_tokens"):
        LentPrefillRule(max_tokens=-1)


def test_the_bound_fits_short_prompts_and_no_bound_fits_all() -> None:
    assert LentPrefillRule(max_tokens=128).fits(128)
    assert not LentPrefillRule(max_tokens=128).fits(129)
    assert LentPrefillRule().fits(1_000_000)


def test_exclusive_lent_slots_wait_only_for_the_prefills_within_their_limit() -> None:
    one, two = _endpoints(1, 2)
    pacer = PrefillPacer(1000.0)
    pacer.sent(1, 500, now=0.0, lent=True)  # a lent prefill until 0.5
    pacer.sent(2, 500, now=0.0)  # another request's until 0.5
    assert pacer.allowed([one, two], 0.1) == []  # the pacer waits for every prefill
    assert pacer.next_clear(0.1) == pytest.approx(0.5)
    pacer.exclusive = True
    assert pacer.allowed([one, two], 0.1) == [one]  # another lent one may follow on 1
    assert pacer.next_clear(0.1) == pytest.approx(0.5)  # (endpoint 2's)
    assert pacer.lent_until(1) == pytest.approx(0.5)
    assert pacer.lent_until(2) == 0.0


def test_steering_sends_a_request_within_its_limit_where_lent_prefills_end_soonest() -> None:
    one, two, three = _endpoints(1, 2, 3)
    pacer = PrefillPacer(1000.0)
    pacer.sent(1, 500, now=0.0, lent=True)  # until 0.5
    pacer.sent(2, 200, now=0.0, lent=True)  # until 0.2
    pacer.sent(3, 900, now=0.0)  # not lent: no matter
    steer = LentPrefillRule(steer=True)
    assert steer.steered(pacer, [one, two, three], 0.1) == [three]
    assert steer.steered(pacer, [one, two], 0.1) == [two]
    assert steer.steered(pacer, [one, two], 0.6) == [one, two]  # both done
    assert LentPrefillRule().steered(pacer, [one, two], 0.1) == [one, two]
    assert steer.steered(PrefillPacer(), [one, two], 0.1) == [one, two]  # no estimate


def test_a_deep_pop_takes_a_tenants_first_request_that_passes() -> None:
    counter = itertools.count(1)
    queue = PoolQueue(fairness=fairness_policy("vtc"), ordering=ArrivalOrder())
    long_ = make_request(counter, tenant="a", input_tokens=2000, output_tokens=10)
    short = make_request(counter, tenant="a", input_tokens=50, output_tokens=10)
    later = make_request(counter, tenant="a", input_tokens=60, output_tokens=10)
    for req in (long_, short, later):
        queue.push(req)

    def fits(r: QueuedRequest) -> bool:
        return r.input_tokens <= 100

    assert queue.pop(fits) is None  # the head holds its tenant back
    assert queue.pop(fits, deep=True) == short
    assert queue.pop(fits, deep=True) == later
    assert queue.pop(fits, deep=True) is None
    assert len(queue) == 1
    assert queue.pop() == long_
    assert len(queue) == 0


def _sized(tenant: str, tokens: int) -> Ticket:
    return dataclasses.replace(ticket(tenant, deadline_in=FAR), prefill_tokens=tokens)


@pytest.mark.asyncio
async def test_a_lent_slot_takes_a_short_prompt_past_a_long_one_which_waits() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=8)  # two tenants: shares of 4
    clock = HandClock()
    settings = PoolSettings(lend_max_prefill=100)
    d = PoolDispatcher("p", settings, fleet, clock=clock, tick_s=3600.0, lend=True)
    d.start()
    grants: list[Grant] = []
    try:
        light = [await d.acquire(_sized("b", 10)) for _ in range(6)]
        grants = [await d.acquire(_sized("a", 10)) for _ in range(2)]
        long_ = waiting(d, _sized("a", 2000))
        short = [waiting(d, _sized("a", 50)) for _ in range(2)]
        longer = [waiting(d, _sized("a", 2000)) for _ in range(17)]
        await settle()
        clock.now = 10.0
        for grant in light[1:]:  # b keeps one slot: it stays active, a floods
            grant.release()
        await settle()
        assert d.held_back().flood_limit == 2
        assert [t.done() for t in short] == [True, True]  # lent: the short ones
        assert not any(t.done() for t in [long_, *longer])  # wait for a's own slots
        assert fleet.inflight == {1: 5}  # 3 free, none lent to a long prompt
        for grant in [*grants, *(t.result() for t in short)]:
            grant.release()  # a holds nothing: within its limit again
        await settle()
        assert long_.done()  # first in a's order
        grants = [long_.result(), light[0], *await granted(longer)]
    finally:
        for grant in grants:
            grant.release()
        await d.stop()


@pytest.mark.asyncio
async def test_a_preempted_request_resumes_on_a_lent_slot_whatever_its_context() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=8)
    clock = HandClock()
    settings = PoolSettings(preemption="fair", resume_first=True, lend_max_prefill=100)
    d = PoolDispatcher("p", settings, fleet, clock=clock, tick_s=3600.0)
    d.start()
    grants: list[Grant] = []
    try:
        light = [await d.acquire(_sized("b", 10)) for _ in range(6)]
        flood = [await d.acquire(_sized("a", 10)) for _ in range(2)]
        short = [waiting(d, _sized("a", 50)) for _ in range(4)]
        longer = [waiting(d, _sized("a", 2000)) for _ in range(16)]
        await settle()
        clock.now = 10.0
        for grant in light[1:]:
            grant.release()
        await settle()
        lent = [t.result() for t in short]  # the long ones are not lent: a slot stays free
        assert fleet.inflight == {1: 7}
        for grant in lent:
            grant.charge_output(600)  # a resume would prefill 650 tokens
        for grant in [*flood, *lent]:
            grant.preemptible(Stream())
        flood[0].charge_output(500)  # 510 tokens: the cheapest victim
        flood[1].charge_output(550)
        grants = [light[0], *flood, *lent, await d.acquire(_sized("b", 10))]
        grants.append(await d.acquire(_sized("b", 10)))  # the pool is full: a preemption
        assert flood[0].parked
        grants[-1].release()  # a slot, lent: the resume's 510 tokens are not bounded
        await settle()
        assert not flood[0].parked
        assert not any(t.done() for t in longer)
        grants += await granted(longer)
    finally:
        for grant in grants:
            grant.release()
        await d.stop()
