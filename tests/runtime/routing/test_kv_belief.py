"""The KV-event endpoints' belief: max(precise, the approximate index bounded to the engine's
capacity), the capacity learnt from the events (``runtime/routing/kv_tracker.py``)."""

from __future__ import annotations

import pytest

from bench.prefix_generated import Events, parse_args, replay
from runtime.routing.kv_events import KvEventBatch
from runtime.routing.kv_index import EventedPrefixIndex
from runtime.routing.prefix import chat_block_hashes
from runtime.workers.simulator.prefix_cache import (
    PrefixCache,
    PrefixCacheConfig,
    render_chat,
    text_block_hashes,
)

pytestmark = pytest.mark.unit


def test_a_chat_where_precise_alone_under_claims_the_trackers_belief_does_not() -> None:
    # Multi-turn chats whose history holds the engine's own answers, through the simulator's
    # cache with heavy eviction (512 blocks), its events fed to the real tracker.
    tallies = replay(
        parse_args(["--answers", "engine", "--requests", "400", "--capacity-blocks", "512"])
    )
    precise, belief, sized = tallies["precise"], tallies["tracker"], tallies["max(p,sized)"]
    assert precise.under > 0.3 * precise.requests  # precise alone: ~43 % under-claimed
    assert belief.under * 3 < precise.under  # the tracker's own belief: ~12 %
    assert abs(belief.claimed - belief.held) < 0.05 * belief.held
    assert belief.over < 0.1 * belief.requests
    # It is the replay's max(precise, approximate bounded to the capacity), within a request
    # or two (before the first eviction it is precise alone).
    assert abs(belief.under - sized.under) <= 2
    assert abs(belief.over - sized.over) <= 2


def test_the_capacity_is_learnt_from_the_events_and_bounds_the_approximate_index() -> None:
    events = Events()
    cache = PrefixCache(PrefixCacheConfig(16, 64), listener=events)  # 64 blocks = 16 router
    index = EventedPrefixIndex()
    index.tracker.set_connected(1, True)
    capacities: list[int | None] = []
    for n in range(60):
        messages = [("system", f"tenant {n % 3}"), ("user", f"question {n}: " + "word " * 200)]
        router = chat_block_hashes(messages)
        rendered = render_chat(messages)
        believed = index.match(router, float(n), [1]).get(1, 0)
        precise = index.tracker.precise_index.match(router, float(n), [1]).get(1, 0)
        if index.tracker.capacity(1) is None:
            assert believed == precise  # before any eviction: precise alone, as before
        else:
            assert believed >= precise
        index.record(1, router, float(n))  # the dispatch
        cache.admit(text_block_hashes(rendered, 16), len(rendered) // 4)
        index.tracker.apply(1, KvEventBatch(-1, float(n), tuple(events.events)), float(n))
        events.events.clear()
        capacities.append(index.tracker.capacity(1))
        assert index.blocks(1) <= (capacities[-1] or index.max_blocks_per_endpoint)
    assert capacities[0] is None  # the first prompt filled no cache
    assert capacities[-1] == 64 * 16 * 4 // 256  # engine blocks to router blocks: 16
    assert index.blocks(1) == 16  # the memory bound: the engine's capacity, not 16,384
    index.forget(1)
    index.tracker.forget(1)
    assert index.blocks(1) == 0
    assert index.tracker.capacity(1) is None
