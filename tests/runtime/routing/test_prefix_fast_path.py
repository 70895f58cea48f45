"""Prefix routing's cheap paths decide as the full ones did (issue #35: no cost on traffic
without shared prefixes): no rendering below one block, one lookup for a first block no
endpoint holds, the tracker's match while no events flow, the stage's per-snapshot rule."""

from __future__ import annotations

import random
from typing import cast

import msgspec
import pytest

from bench.prefix_stages import MESSAGES, MODEL, _context, _snapshot
from runtime.admission.redis_limits import RedisLimits
from runtime.gateway.bundles import AdmissionDeps, PriceHolder
from runtime.gateway.pipeline.stages.prefix import PrefixBlocks, prompt_prefix
from runtime.gateway.schema import ChatRequest
from runtime.routing.kv_index import EventedPrefixIndex
from runtime.routing.kv_subscriber import KvEventSubscribers
from runtime.routing.kv_tracker import KvEventTracker
from runtime.routing.prefix import (
    DEFAULT_BLOCK_CHARS,
    block_hashes,
    render_chat,
    rendered_length,
)
from runtime.routing.prefix_index import PrefixIndex
from runtime.routing.prefix_placer import PrefixPlacer
from runtime.routing.table import RoutingTable
from runtime.scheduling.pools import Dispatchers
from runtime.telemetry.metrics import RouterMetrics
from runtime.testing.fleet import HandFleet
from runtime.testing.snapshots import endpoint_snap, version_snap

pytestmark = pytest.mark.unit


def chat(*messages: tuple[str, str]) -> ChatRequest:
    body = {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages]}
    return msgspec.convert(body, ChatRequest)


def test_the_rendered_length_is_the_renderings_and_a_prompt_below_one_block_has_none() -> None:
    rng = random.Random(35)
    for _ in range(200):
        messages = [
            (rng.choice(("system", "user", "assistant")), "x" * rng.randrange(0, 400))
            for _ in range(rng.randrange(1, 5))
        ]
        assert rendered_length(messages) == len(render_chat(messages))
    version = version_snap(1, "m")
    overhead = len(render_chat([("user", "")]))  # the role and two separators
    below = chat(("user", "q" * (DEFAULT_BLOCK_CHARS - overhead - 1)))
    exact = chat(("user", "q" * (DEFAULT_BLOCK_CHARS - overhead)))
    assert prompt_prefix(below, version) is None
    found = prompt_prefix(exact, version)
    assert found is not None
    assert found.hashes == block_hashes(render_chat([("user", "q" * (256 - overhead))]))


def _leading_held(index: PrefixIndex, hashes: tuple[int, ...], now: float) -> dict[int, int]:
    """The reference: per endpoint, its leading held (unexpired) blocks, counted one by one."""
    found: dict[int, int] = {}
    oldest = now - index.ttl_seconds
    for endpoint_id in index.sizes():
        blocks = index._endpoints[endpoint_id]  # the reference reads the index
        held = 0
        for block_hash in hashes:
            seen = blocks.get(block_hash)
            if seen is None or seen < oldest:
                break
            held += 1
        if held:
            found[endpoint_id] = held
    return found


def test_the_first_block_lookup_matches_the_leading_held_blocks() -> None:
    rng = random.Random(7)
    index = PrefixIndex(max_blocks_per_endpoint=64, ttl_seconds=5.0)
    prompts = [block_hashes(f"p{n}:" + "x" * rng.randrange(300, 3000)) for n in range(20)]
    for step in range(400):
        prompt = rng.choice(prompts)
        cut = prompt[: rng.randrange(0, len(prompt) + 1)]
        now = step * 0.05
        assert index.match(prompt, now) == _leading_held(index, prompt, now)
        assert index.holds(1, prompt[0], now) == (index.match(prompt[:1], now, [1]) == {1: 1})
        index.record(rng.choice((1, 2, 3)), cut, now)


def test_the_tracker_without_live_events_answers_as_the_approximate_index() -> None:
    approximate = PrefixIndex()
    tracker = KvEventTracker(approximate=approximate)
    prompt = block_hashes("s" * 2000)
    approximate.record(1, prompt, 0.0)
    approximate.record(2, prompt[:3], 0.0)
    tracker.note_dispatch(1, prompt, 0.0)
    tracker.set_connected(2, True)  # connected, no event yet: not precise
    assert tracker.match(prompt, 0.1, [1, 2, 3]) == {1: len(prompt), 2: 3}
    assert KvEventTracker().match(prompt, 0.1, [1, 2]) == {}  # no approximate index
    tracker.set_connected(2, False)
    assert tracker.match(prompt, 0.1, [1, 2]) == {1: len(prompt), 2: 3}


def test_a_conversation_whose_first_turn_is_one_block_still_sticks_on_later_turns() -> None:
    """The cheap paths skip nothing a later turn needs: the first turn's single block is
    learned where it went, so the next turn (history and answer) sticks there."""
    placer = PrefixPlacer(index=EventedPrefixIndex())
    eps = [endpoint_snap(i, capacity=8) for i in (1, 2, 3)]
    version = version_snap(1, "m")
    first_turn = [("user", "tell me about routing " + "q" * 260)]
    first = prompt_prefix(chat(*first_turn), version)
    assert first is not None
    assert len(first.hashes) == 1
    match = placer.match(first, eps)
    assert match.matched == {}
    assert placer.sticky(eps, match, lambda _: 0) is None  # a new prompt: by load
    placer.sent(2, first, match)
    placer.started(first)
    history = [*first_turn, ("assistant", "a" * 500)]
    for turn in range(3):
        later = prompt_prefix(chat(*history, ("user", f"and then {turn}?")), version)
        assert later is not None
        match = placer.match(later, eps)
        assert match.matched.get(2, 0) >= 1
        chosen = placer.sticky(eps, match, lambda _: 0)
        assert chosen is not None
        assert chosen.id == 2
        placer.sent(chosen.id, later, match)
        placer.started(later)
        history = [*history, ("user", f"and then {turn}?"), ("assistant", "b" * 300)]


def test_a_short_first_turn_carries_no_prefix_and_its_next_turn_routes_by_load() -> None:
    """Below one block nothing is hashed (as before): the next turn has nothing to match."""
    placer = PrefixPlacer()
    eps = [endpoint_snap(i, capacity=8) for i in (1, 2)]
    version = version_snap(1, "m")
    assert prompt_prefix(chat(("user", "hi")), version) is None
    later = prompt_prefix(chat(("user", "hi"), ("assistant", "a" * 400), ("user", "?")), version)
    assert later is not None
    assert placer.sticky(eps, placer.match(later, eps), lambda _: 0) is None


@pytest.mark.asyncio
async def test_the_stage_reads_a_pools_switch_and_rule_once_per_snapshot() -> None:
    fleet = HandFleet()
    deps = AdmissionDeps(
        limits=cast(RedisLimits, None),
        dispatchers=Dispatchers(placement_for=lambda _pool: fleet, tick_s=0.05),
        table=RoutingTable(), prices=PriceHolder(), metrics=RouterMetrics(), default_band=1,
    )  # fmt: skip
    stage = PrefixBlocks(deps)
    body = msgspec.json.encode({"model": MODEL, "messages": MESSAGES, "stream": True})
    off = _snapshot({"prefix_routing": "off"})
    on = _snapshot({"prefix_stickiness": "4"})
    ctx = _context(off, body)
    await stage(ctx)
    assert ctx.ready_plan.prefix is None
    for _ in range(2):  # a new snapshot's policies apply at once, then from the cache
        ctx = _context(on, body)
        await stage(ctx)
        prefix = ctx.ready_plan.prefix
        assert prefix is not None
        assert prefix.rule is not None
        assert prefix.rule.stickiness == 4.0
        await ctx.exits.aclose()  # the request's end releases its queued prefill
    ctx = _context(off, body)
    await stage(ctx)
    assert ctx.ready_plan.prefix is None


@pytest.mark.asyncio
async def test_a_dispatch_to_an_endpoint_without_subscribed_events_keeps_nothing_pending() -> None:
    tracker = KvEventTracker()
    prompt = block_hashes("s" * 1000)
    tracker.note_dispatch(1, prompt, 0.0)  # not told which are watched: every endpoint is
    assert tracker.sizes() == {1: (0, 1)}
    subscribers = KvEventSubscribers(tracker)
    try:
        subscribers.sync({2: "tcp://127.0.0.1:9", 3: ""})  # 2 only (3 publishes none)
        tracker.note_dispatch(1, prompt, 0.1)
        tracker.note_dispatch(3, prompt, 0.1)
        tracker.note_dispatch(2, prompt, 0.1)
        assert tracker.sizes()[2] == (0, 1)
        assert 3 not in tracker.sizes()
        assert tracker.sizes()[1] == (0, 1)  # the one from before, nothing new
    finally:
        await subscribers.close()
