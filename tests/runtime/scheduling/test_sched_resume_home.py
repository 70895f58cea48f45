"""Resume affinity (issue #34): the pool policies ``resume_affinity`` and ``resume_hold_ms``,
the rule (:mod:`runtime.scheduling.resume_home`) and the dispatcher resuming a preempted
request on its home endpoint."""

from __future__ import annotations

import asyncio

import pytest
from dispatch_support import HandClock, settle, ticket, waiting

from runtime.pool_policies import pool_policy_errors
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Grant
from runtime.scheduling.resume_home import ResumeHomeRule, ResumeHomes
from runtime.scheduling.settings import PoolSettings, SettingsError
from runtime.testing.fleet import HandFleet

pytestmark = pytest.mark.unit

FAR = 1e6


def test_the_pool_policies_name_the_affinity_and_its_hold() -> None:
    settings = PoolSettings.from_policies({"resume_affinity": "on", "resume_hold_ms": "250"}, ())
    assert settings.resume_home() == ResumeHomeRule(affinity=True, hold_s=0.25)
    assert PoolSettings().resume_home() == ResumeHomeRule()  # off, no hold
    assert pool_policy_errors({"preemption": "fair", "resume_affinity": "on",
                               "resume_hold_ms": "100"}) == []  # fmt: skip
    for bad in ({"resume_affinity": "yes"}, {"resume_hold_ms": "-1"},
                {"resume_hold_ms": "soon"}, {"resume_hold_ms": "inf"}):  # fmt: skip
        with pytest.raises(SettingsError):
            PoolSettings.from_policies(bad, ())
        assert pool_policy_errors(bad) != []
    with pytest.raises(ValueError, match="hold_s"):
        ResumeHomeRule(hold_s=-0.1)


def _fleet() -> tuple[HandFleet, list[object]]:
    fleet = HandFleet()
    for endpoint_id in (1, 2, 3):
        fleet.add(endpoint_id, capacity=2)
    return fleet, list(fleet.candidates(1, frozenset()))


def test_the_rule_keeps_a_resume_on_its_home_or_holds_for_it_a_bounded_time() -> None:
    _, (one, two, three) = _fleet()  # type: ignore[misc]
    homes = ResumeHomes(ResumeHomeRule(affinity=True, hold_s=0.5))
    homes.left("r", 2, now=10.0)
    everyone = [one, two, three]
    assert homes.room("r", [one, two, three], everyone, 10.1) == (two,)  # home has room
    assert homes.room("r", [one, three], everyone, 10.1) == ()  # full home: it holds
    assert homes.held == 1
    assert list(homes.room("r", [one, three], everyone, 10.5)) == [one, three]  # hold over
    assert list(homes.room("r", [one], [one, three], 10.1)) == [one]  # home gone: no hold
    assert list(homes.room("other", [one], everyone, 10.1)) == [one]  # not a resume
    assert homes.forget("r") == 2
    assert homes.forget("r") is None
    assert len(homes) == 0


def test_with_the_affinity_off_nothing_is_noted() -> None:
    _, (one, two, _three) = _fleet()  # type: ignore[misc]
    homes = ResumeHomes()
    homes.left("r", 2, now=0.0)
    assert len(homes) == 0
    assert list(homes.room("r", [one], [one, two], 0.0)) == [one]


class _Stream:
    def preemptible(self) -> bool:
        return True

    def preempt(self) -> None:
        pass


async def _preempted(
    d: PoolDispatcher, clock: HandClock
) -> tuple[Grant, list[Grant], Grant, list[asyncio.Task[Grant]]]:
    """The flooder ``a`` on lent slots of both endpoints, then ``b``'s arrival preempts
    one: (the victim, the flooder's other grants, the arrival's grant, a's queued)."""
    light = [await d.acquire(ticket("b", deadline_in=FAR)) for _ in range(3)]
    flood = [await d.acquire(ticket("a", deadline_in=FAR)) for _ in range(1)]
    queued = [waiting(d, ticket("a", deadline_in=FAR)) for _ in range(6)]
    await settle()
    clock.now = 10.0
    for grant in light:
        grant.release()
    await settle()
    lent = flood + [t.result() for t in queued if t.done()]
    assert len(lent) == 4
    for n, grant in enumerate(lent):
        grant.charge_output(10 * (n + 1))  # the first has lost least progress: the victim
        grant.preemptible(_Stream())
    victim = lent[0]
    arrival = await asyncio.wait_for(d.acquire(ticket("b", deadline_in=FAR)), 1.0)
    assert victim.parked
    return victim, lent[1:], arrival, [t for t in queued if not t.done()]


@pytest.mark.asyncio
@pytest.mark.parametrize("affinity", ["on", "off"])
async def test_a_preempted_request_waits_for_its_home_and_resumes_there(affinity: str) -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=2)
    fleet.add(2, capacity=2)
    clock = HandClock()
    settings = PoolSettings.from_policies({"preemption": "fair", "resume_first": "on",
                                           "resume_affinity": affinity,
                                           "resume_hold_ms": "60000"}, ())  # fmt: skip
    d = PoolDispatcher("p", settings, fleet, clock=clock, tick_s=3600.0)
    d.start()
    try:
        victim, others, arrival, queued = await _preempted(d, clock)
        assert arrival.endpoint is not None
        home = arrival.endpoint.id  # the arrival took the victim's slot
        away = next(g for g in others if g.endpoint is not None and g.endpoint.id != home)
        away.release()  # a slot frees elsewhere first
        await settle()
        if affinity == "off":
            await asyncio.wait_for(victim.resumed(), 1.0)
            assert victim.endpoint is not None
            assert victim.endpoint.id != home  # it resumes where the prefix cache is cold
        else:
            assert victim.parked  # it holds for its home
            arrival.release()
            await asyncio.wait_for(victim.resumed(), 1.0)
            assert victim.endpoint is not None
            assert victim.endpoint.id == home
        for task in queued:
            task.cancel()
        await settle()
        for grant in [victim, arrival, *others]:
            grant.release()
    finally:
        await d.stop()


@pytest.mark.asyncio
async def test_a_home_that_is_gone_is_not_waited_for() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=2)
    fleet.add(2, capacity=2)
    clock = HandClock()
    settings = PoolSettings.from_policies({"preemption": "fair", "resume_first": "on",
                                           "resume_affinity": "on",
                                           "resume_hold_ms": "60000"}, ())  # fmt: skip
    d = PoolDispatcher("p", settings, fleet, clock=clock, tick_s=3600.0)
    d.start()
    try:
        victim, others, arrival, queued = await _preempted(d, clock)
        assert arrival.endpoint is not None
        home = arrival.endpoint.id
        fleet.down.add(home)  # the engine died: its endpoint is no longer a candidate
        away = next(g for g in others if g.endpoint is not None and g.endpoint.id != home)
        away.release()
        await settle()
        await asyncio.wait_for(victim.resumed(), 1.0)
        assert victim.endpoint is not None
        assert victim.endpoint.id != home
        for task in queued:
            task.cancel()
        await settle()
        for grant in [victim, arrival, *others]:
            grant.release()
    finally:
        await d.stop()
