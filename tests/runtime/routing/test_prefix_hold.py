"""The prefix hold: a request whose cached prefix is on a full endpoint waits (bounded) for a
slot there instead of prefilling it all again elsewhere; through the real dispatcher, its
fleet placement and the prefix placer."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import pytest_asyncio
from routing_support import endpoint, snapshot

from runtime.routing.inflight import InFlight
from runtime.routing.prefix import PromptPrefix, chat_block_hashes
from runtime.routing.prefix_placer import PrefixPlacer
from runtime.routing.signals import FleetSignals
from runtime.routing.sticky import StickyRule, prefix_hold, sticky_policy_errors
from runtime.routing.table import RoutingTable
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Grant, Ticket
from runtime.scheduling.placement import FleetPlacement
from runtime.scheduling.settings import PoolSettings
from runtime.upstream.breaker import BreakerBook
from runtime.upstream.client import UpstreamClient
from runtime.upstream.health import HealthMonitor

pytestmark = pytest.mark.unit

SYSTEM = "You are a careful assistant. " * 80  # ~2,300 characters: 9 blocks, 576 tokens
HASHES = chat_block_hashes([("system", SYSTEM), ("user", "hi")])
EPS = (endpoint(1, capacity=1), endpoint(2, capacity=1))


def test_the_hold_rule_wants_a_real_saving_and_a_short_wait() -> None:
    rule = StickyRule(hold_ms=250, hold_min_tokens=512)
    assert prefix_hold(2000, 0, 0.0, rule)
    assert prefix_hold(2000, 1488, 0.249, rule)
    assert not prefix_hold(2000, 1489, 0.0, rule)  # saves too little
    assert not prefix_hold(2000, 0, 0.25, rule)  # waited long enough
    assert not prefix_hold(2000, 0, 0.0, StickyRule(hold_ms=0))  # off
    assert StickyRule.from_policies({"prefix_hold_ms": "0", "prefix_hold_min_tokens": "64"}) == (
        StickyRule(hold_ms=0.0, hold_min_tokens=64)
    )
    assert sticky_policy_errors({"prefix_hold_ms": "-1", "prefix_hold_min_tokens": "x"}) == [
        "prefix_hold_ms: hold_ms must be >= 0.",
        "prefix_hold_min_tokens: hold_min_tokens must be an integer, got 'x'.",
    ]


def test_the_placer_holds_only_while_a_full_endpoint_has_much_more_of_the_prefix() -> None:
    placer = PrefixPlacer(clock=lambda: 0.0)
    prefix = PromptPrefix(hashes=HASHES, prompt_tokens=600)
    two = EPS[1]
    assert placer.room(prefix, [two], EPS, waited_s=0.0) == [two]  # nobody holds it
    placer.sent(1, prefix, placer.match(prefix, EPS))
    assert placer.room(prefix, [two], EPS, waited_s=0.0) == ()  # 1 is full and holds it
    assert placer.room(prefix, [two], EPS, waited_s=0.0) == ()  # still: its hold just began
    assert placer.room(prefix, EPS, EPS, waited_s=0.0) == EPS  # 1 has room: the rule decides
    placer.sent(2, prefix, placer.match(prefix, EPS))
    assert placer.room(prefix, [two], EPS, waited_s=0.0) == [two]  # 2 holds it too
    short = PromptPrefix(hashes=HASHES[:4], prompt_tokens=300)  # 256 tokens: not worth it
    fresh = PrefixPlacer(clock=lambda: 0.0)
    fresh.sent(1, short, fresh.match(short, EPS))
    assert fresh.room(short, [two], EPS, waited_s=0.0) == [two]


def test_the_hold_runs_from_the_first_time_an_endpoint_had_room_for_the_request() -> None:
    """Sticky while saturated: a request that queued long (every endpoint full: the pool past
    capacity) still holds for its prefix's endpoint once another endpoint has room, for
    ``hold_ms`` from then; below capacity that is from its arrival, as before."""
    now = [0.0]
    placer = PrefixPlacer(rule=StickyRule(hold_ms=250), clock=lambda: now[0])
    placer.sent(1, PromptPrefix(hashes=HASHES, prompt_tokens=600), placer.match(
        PromptPrefix(hashes=HASHES, prompt_tokens=600), EPS))  # fmt: skip
    two = EPS[1]
    queued = PromptPrefix(hashes=HASHES, prompt_tokens=650)
    now[0] = 8.0  # it has waited 8 s in the queue: endpoint 2 has room for it only now
    assert placer.room(queued, [two], EPS, waited_s=8.0) == ()  # holds for endpoint 1
    now[0] = 8.249
    assert placer.room(queued, [two], EPS, waited_s=8.249) == ()
    now[0] = 8.25  # held hold_ms since endpoint 2 first had room: it goes there
    assert placer.room(queued, [two], EPS, waited_s=8.25) == [two]
    # A request asked at its arrival holds no longer than hold_ms since then either.
    fresh = PromptPrefix(hashes=HASHES, prompt_tokens=700)
    assert placer.room(fresh, [two], EPS, waited_s=0.0) == ()
    now[0] = 8.5
    assert placer.room(fresh, [two], EPS, waited_s=0.25) == [two]
    # Dispatched: forgotten (an unrelated later ask starts a new hold).
    placer.sent(1, queued, placer.match(queued, EPS))
    placer.started(queued)
    assert placer.room(queued, [two], EPS, waited_s=9.0) == ()


@dataclass
class Pool:
    dispatcher: PoolDispatcher
    placer: PrefixPlacer
    inflight: InFlight

    def ticket(self, prefix: PromptPrefix | None, tenant: str = "a") -> Ticket:
        loop = asyncio.get_running_loop()
        return Ticket(
            tenant=tenant, version=1, input_tokens=600, max_output_tokens=10, band=0,
            class_name="standard", shed_order=0, weight=1.0, deadline=loop.time() + 30,
            prefix=prefix,
        )  # fmt: skip


@pytest_asyncio.fixture
async def pool() -> AsyncIterator[Pool]:
    world = snapshot(endpoints=EPS)
    client = UpstreamClient()
    health = HealthMonitor(client)  # not started: no scraped gauges, in-flight decides
    inflight = InFlight()
    loop = asyncio.get_running_loop()
    placer = PrefixPlacer(rule=StickyRule(hold_ms=5_000), clock=loop.time)
    placement = FleetPlacement(
        "p", snapshot=lambda: world, table=RoutingTable(), health=health, inflight=inflight,
        signals=FleetSignals(breakers=BreakerBook(), health=health, inflight=inflight),
        clock=loop.time, prefix=placer,
    )  # fmt: skip
    dispatcher = PoolDispatcher("p", PoolSettings(), placement, clock=loop.time, tick_s=0.01)
    dispatcher.start()
    try:
        yield Pool(dispatcher, placer, inflight)
    finally:
        await dispatcher.stop()
        await client.close()


def _endpoint(grant: Grant) -> int:
    assert grant.endpoint is not None
    return grant.endpoint.id


@pytest.mark.asyncio
async def test_a_request_waits_for_the_full_endpoint_holding_its_prefix(pool: Pool) -> None:
    first = PromptPrefix(hashes=HASHES, prompt_tokens=600)
    held = await pool.dispatcher.acquire(pool.ticket(first))  # nothing cached: by load
    home = _endpoint(held)
    pool.placer.started(first)
    other = await pool.dispatcher.acquire(pool.ticket(None))  # no prefix: takes the other
    assert _endpoint(other) != home
    other.release()
    # The home endpoint is full, the other one free: the next turn waits for its home.
    waiting = asyncio.create_task(
        pool.dispatcher.acquire(pool.ticket(PromptPrefix(hashes=HASHES, prompt_tokens=650)))
    )
    for _ in range(5):
        await asyncio.sleep(0)
    assert not waiting.done()
    # Another tenant's request passes it (its own tenant's later ones wait behind it, in the
    # queue's per-tenant order).
    unrelated = await pool.dispatcher.acquire(pool.ticket(None, tenant="b"))
    assert _endpoint(unrelated) != home
    held.release()
    grant = await asyncio.wait_for(waiting, timeout=5)
    assert _endpoint(grant) == home
    for g in (grant, unrelated):
        g.release()


@pytest.mark.asyncio
async def test_a_held_request_goes_elsewhere_once_it_has_waited_hold_ms(pool: Pool) -> None:
    first = PromptPrefix(hashes=HASHES, prompt_tokens=600)
    held = await pool.dispatcher.acquire(pool.ticket(first))
    home = _endpoint(held)
    pool.placer.started(first)
    pool.placer.rule = StickyRule(hold_ms=30)
    grant = await asyncio.wait_for(
        pool.dispatcher.acquire(pool.ticket(PromptPrefix(hashes=HASHES, prompt_tokens=650))),
        timeout=5,
    )  # the dispatcher's tick lets it go after 30 ms
    assert _endpoint(grant) != home
    assert grant.waited_s >= 0.03
    for g in (grant, held):
        g.release()
