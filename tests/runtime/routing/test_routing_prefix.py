"""Approximate prefix routing: block hashes, the learned index, the scorer, the sticky rule."""

from __future__ import annotations

import gc
import tracemalloc

import pytest
from routing_support import Signals, endpoint, snapshot

from runtime.routing.endpoints import EndpointSelector
from runtime.routing.prefix import (
    PrefixMatch,
    block_hashes,
    chat_block_hashes,
    render_chat,
)
from runtime.routing.prefix_index import PrefixIndex
from runtime.routing.signals import RequestSignals
from runtime.routing.sticky import Candidate, StickyRule, sticky_choice

pytestmark = pytest.mark.unit

SYSTEM = "You are the ACME support assistant. Answer briefly and politely. " * 30  # ~2,000 chars


# -- block hashes ------------------------------------------------------------------------------
def test_only_full_blocks_are_hashed_and_each_covers_its_parent():
    assert block_hashes("x" * 255, 256) == ()
    hashes = block_hashes("x" * 256 * 3 + "y" * 10, 256)
    assert len(hashes) == 3
    assert len(set(hashes)) == 3  # same characters, other parents: other hashes
    assert block_hashes("x" * 256 * 2, 256) == hashes[:2]
    with pytest.raises(ValueError, match="block_chars"):
        block_hashes("x", 0)


def test_a_shared_system_prompt_and_a_growing_history_match():
    turn1 = [("system", SYSTEM), ("user", "Where is my parcel?")]
    turn2 = [*turn1, ("assistant", "It left the depot today. " * 10), ("user", "When?")]
    other_user = [("system", SYSTEM), ("user", "Cancel my order please")]
    h1, h2, h3 = (chat_block_hashes(m) for m in (turn1, turn2, other_user))
    assert h1
    assert h2[: len(h1)] == h1  # the next turn repeats every full block of the one before
    system_blocks = len(render_chat([("system", SYSTEM)])) // 256
    assert h3[:system_blocks] == h1[:system_blocks]
    assert chat_block_hashes([("user", SYSTEM)])[0] != h1[0]  # the role is part of the prompt


def test_prefix_match_fraction_and_tokens():
    match = PrefixMatch(blocks=4, matched={1: 4, 2: 1}, block_chars=256)
    assert match.fraction(1) == 1.0
    assert match.fraction(2) == 0.25
    assert match.fraction(3) == 0.0
    assert match.cached_tokens(2) == 64
    assert PrefixMatch(blocks=0).fraction(1) == 0.0


# -- the index ---------------------------------------------------------------------------------
def test_the_index_learns_where_prefixes_went_and_matches_the_longest_run():
    index = PrefixIndex(max_blocks_per_endpoint=100, ttl_seconds=60)
    turn1 = chat_block_hashes([("system", SYSTEM), ("user", "hello " * 50)])
    index.record(1, turn1, now=0.0)
    index.record(2, turn1[:2], now=0.0)
    assert index.match(turn1, now=1.0) == {1: len(turn1), 2: 2}
    assert index.match(turn1, now=1.0, endpoint_ids=[2, 3]) == {2: 2}
    # Another first block changes every hash after it: nothing matches.
    other = chat_block_hashes([("system", "x" + SYSTEM), ("user", "hello " * 50)])
    assert index.match(other, now=1.0) == {}
    # A prompt that goes on past what was sent matches its full blocks.
    assert len(render_chat([("system", SYSTEM), ("user", "hello " * 50)])) % 256  # a partial end
    longer = chat_block_hashes([("system", SYSTEM), ("user", "hello " * 50 + "more " * 200)])
    assert len(longer) > len(turn1)
    assert index.match(longer, now=1.0) == {1: len(turn1), 2: 2}
    assert index.match((), now=1.0) == {}


def test_the_index_forgets_by_lru_tail_first():
    index = PrefixIndex(max_blocks_per_endpoint=4, ttl_seconds=60)
    index.record(1, [1, 2], now=0.0)
    index.record(1, [5, 6], now=1.0)
    index.record(1, [1, 2], now=2.0)  # chain 1-2 is the most recent again
    index.record(1, [7, 8], now=3.0)  # chain 5-6 goes
    assert index.blocks(1) == 4
    assert index.match([5, 6], now=3.0) == {}
    assert index.match([1, 2], now=3.0) == {1: 2}
    index.record(1, [9], now=4.0)  # the LRU tail (block 2) goes, its root stays
    assert index.match([1, 2], now=4.0) == {1: 1}


def test_the_index_forgets_by_ttl_and_by_endpoint():
    index = PrefixIndex(max_blocks_per_endpoint=100, ttl_seconds=10)
    index.record(1, [1, 2, 3], now=0.0)
    index.record(2, [1, 2, 3], now=0.0)
    index.record(2, [1], now=8.0)
    assert index.match([1, 2, 3], now=9.0) == {1: 3, 2: 3}
    assert index.match([1, 2, 3], now=11.0) == {2: 1}  # only the refreshed root is young
    index.record(2, [4], now=11.0)  # recording expires the old entries from the LRU end
    assert index.blocks(2) == 2
    index.retain([2])
    assert index.sizes() == {2: 2}
    index.forget(2)
    assert index.sizes() == {}
    with pytest.raises(ValueError, match="max_blocks"):
        PrefixIndex(max_blocks_per_endpoint=0)
    with pytest.raises(ValueError, match="ttl"):
        PrefixIndex(ttl_seconds=0)


def test_memory_per_endpoint_is_bounded_and_measured():
    bound = 20_000
    index = PrefixIndex(max_blocks_per_endpoint=bound, ttl_seconds=3600)
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for request in range(bound // 10):  # 2x the bound: 10 fresh blocks per request x 4,000
            index.record(1, [request * 1_000_003 + i + (1 << 40) for i in range(20)], now=1.0)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert index.blocks(1) == bound
    per_block = used / bound
    # CPython 3.11: a 64-bit int key (32 B), an OrderedDict slot and link node; the float
    # value is shared per record. The estimate is within a factor of two of the measurement.
    assert 40 < per_block < 300, per_block
    assert 0.5 < index.approx_bytes(1) / used < 2.0, (index.approx_bytes(1), used)


# -- the scorer --------------------------------------------------------------------------------
def test_prefix_cache_scorer_prefers_the_longest_cached_prefix():
    selector = EndpointSelector.from_policies({"scorers": "prefix_cache"})
    eps = (endpoint(1), endpoint(2), endpoint(3))
    assert selector.select(eps, Signals(cached={1: 0.25, 2: 1.0, 3: 0.5})).id == 2  # type: ignore[union-attr]
    # Without a match every endpoint scores alike: the picker's round-robin decides.
    picks = {selector.select(eps, Signals()).id for _ in range(3)}  # type: ignore[union-attr]
    assert picks == {1, 2, 3}


def test_prefix_cache_combines_with_load_through_request_signals():
    snap = snapshot(endpoints=(endpoint(1), endpoint(2)))
    selector = EndpointSelector.from_policies({"scorers": "prefix_cache,least_load"})
    eps = list(snap.endpoints.values())
    idle = Signals()
    full = RequestSignals(idle, snap, prefix=PrefixMatch(blocks=8, matched={2: 8}))
    assert selector.select(eps, full).id == 2  # type: ignore[union-attr]
    # Endpoint 2 is full (4 of 4 in flight): load outweighs a half-cached prompt.
    busy = Signals(inflight={2: 4})
    half = RequestSignals(busy, snap, prefix=PrefixMatch(blocks=8, matched={2: 4}))
    assert selector.select(eps, half).id == 1  # type: ignore[union-attr]
    assert RequestSignals(idle, snap).cached_prefix(1) is None


# -- sticky until saturated --------------------------------------------------------------------
def cand(eid: int, cached: int, queued: int = 0, inflight: int = 0, cap: int = 8) -> Candidate:
    return Candidate(eid, cached, queued, inflight, cap)


RULE = StickyRule(min_saved_tokens=64, stickiness=1.0)


def test_sticks_to_the_longest_cached_prefix_while_the_queue_costs_less_than_it_saves():
    assert sticky_choice([cand(1, 0), cand(2, 2000), cand(3, 500)], RULE) == 2
    # 2,000 tokens saved, 1,500 more queued there: still worth it.
    assert sticky_choice([cand(1, 0, queued=0), cand(2, 2000, queued=1500)], RULE) == 2
    # 2,500 more queued than the light endpoint: saturated, route by load.
    assert sticky_choice([cand(1, 0, queued=0), cand(2, 2000, queued=2500)], RULE) is None
    # A stickier rule (the default) keeps it.
    sticky = StickyRule()
    assert sticky_choice([cand(1, 0, queued=0), cand(2, 2000, queued=2500)], sticky) == 2


def test_falls_back_to_load_when_the_saving_is_small_or_the_batch_is_full():
    assert sticky_choice([cand(1, 0), cand(2, 32)], RULE) is None
    assert sticky_choice([cand(1, 0), cand(2, 0)], RULE) is None
    assert sticky_choice([cand(1, 0), cand(2, 2000, inflight=8, cap=8)], RULE) is None
    three_quarters = StickyRule(max_load=0.75)
    assert sticky_choice([cand(1, 0), cand(2, 2000, inflight=6, cap=8)], three_quarters) is None
    assert sticky_choice([], RULE) is None
    # The longest prefix that is also the least queued: stick.
    assert sticky_choice([cand(1, 640), cand(2, 0, queued=100)], RULE) == 1


def test_among_endpoints_holding_the_same_prefix_the_least_queued_one_keeps_it():
    # A system prompt replicated on 2 and 3: no saving edge between them, but routing by load
    # over all endpoints could pick 1 and prefill the prompt again. 3 is lighter: it keeps it.
    shared = [cand(1, 0, inflight=0), cand(2, 2000, inflight=3), cand(3, 2000, inflight=1)]
    assert sticky_choice(shared, RULE) == 3
    # The least queued prefill first, then the least in flight.
    queued = [cand(1, 0), cand(2, 2000, queued=0, inflight=5), cand(3, 2000, queued=300)]
    assert sticky_choice(queued, RULE) == 2
    # ... unless that endpoint's batch is full: route by load.
    full = [cand(1, 0), cand(2, 2000, inflight=8, cap=8), cand(3, 2000, queued=300, inflight=8)]
    assert sticky_choice(full, RULE) is None
    # A shared prefix shorter than min_saved_tokens is no reason to stay.
    assert sticky_choice([cand(1, 0, inflight=2), cand(2, 32), cand(3, 32)], RULE) is None


def test_rule_parameters_are_validated():
    for name, bad in (("min_saved_tokens", 0), ("stickiness", -1), ("slack_tokens", -1),
                      ("max_load", 0)):  # fmt: skip
        with pytest.raises(ValueError, match=name):
            StickyRule(**{name: bad})  # type: ignore[arg-type]
