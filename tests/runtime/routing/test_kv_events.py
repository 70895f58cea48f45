"""KV events: the decoder against vLLM's own encoding, and the tracker that maps engine blocks
onto the router's blocks (precise scoring, its fallback to approximate)."""

from __future__ import annotations

import importlib.util
import tracemalloc

import msgspec
import pytest

from runtime.routing.kv_events import (
    AllCleared,
    BlockRemoved,
    BlockStored,
    KvEventBatch,
    KvEventDecodeError,
    decode_frames,
    decode_payload,
    encode_frames,
)
from runtime.routing.kv_index import EventedPrefixIndex
from runtime.routing.kv_subscriber import snapshot_addresses
from runtime.routing.kv_tracker import KvEventTracker
from runtime.routing.prefix import block_hashes
from runtime.routing.prefix_index import PrefixIndex
from runtime.snapshot import Snapshot
from runtime.testing.snapshots import endpoint_snap

pytestmark = pytest.mark.unit

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None, reason="vllm is not installed"
)


# -- the decoder --------------------------------------------------------------------------------
@needs_vllm
def test_vllms_own_batch_decodes():
    from vllm.distributed import kv_events as v  # noqa: PLC0415 - optional, slow to import

    batch = v.KVEventBatch(
        ts=12.5,
        events=[
            v.BlockStored(
                block_hashes=[11, b"\x01" * 32],
                parent_block_hash=None,
                token_ids=list(range(32)),
                block_size=16,
                lora_id=None,
                medium="CPU",
                lora_name=None,
                group_idx=0,
            ),
            v.BlockStored(
                block_hashes=[12],
                parent_block_hash=b"\x01" * 32,
                token_ids=list(range(16)),
                block_size=16,
                lora_id=None,
                medium=None,
                lora_name=None,
            ),
            v.BlockRemoved(block_hashes=[12, 11], medium="CPU"),
            v.AllBlocksCleared(),
        ],
        data_parallel_rank=0,
    )
    payload = msgspec.msgpack.Encoder().encode(batch)
    frames = [b"kv", (7).to_bytes(8, "big"), payload]  # as ZmqEventPublisher sends them
    decoded = decode_frames(frames)
    assert decoded.seq == 7
    assert decoded.ts == 12.5
    assert decoded.events == (
        BlockStored(hashes=(11, b"\x01" * 32), parent=None, block_size=16, tokens=32),
        BlockStored(hashes=(12,), parent=b"\x01" * 32, block_size=16, tokens=16),
        BlockRemoved(hashes=(12, 11)),
        AllCleared(),
    )


@needs_vllm
def test_our_encoding_is_what_vllms_classes_decode():
    from vllm.distributed import kv_events as v  # noqa: PLC0415

    frames = encode_frames(
        b"", 3, 1.0, [BlockStored((1, 2), None, 4, 8), BlockRemoved((2,)), AllCleared()]
    )
    batch = msgspec.msgpack.Decoder(v.KVEventBatch).decode(frames[-1])
    stored, removed, cleared = batch.events
    assert isinstance(stored, v.BlockStored)
    assert (stored.block_hashes, stored.parent_block_hash, stored.block_size) == ([1, 2], None, 4)
    assert isinstance(removed, v.BlockRemoved)
    assert removed.block_hashes == [2]
    assert isinstance(cleared, v.AllBlocksCleared)


def test_older_array_encoded_events_decode_and_unknown_kinds_are_skipped():
    payload = msgspec.msgpack.encode(
        [2.0, [["BlockStored", [5], None, [1, 2], 2, None], ["Future", 1], ["BlockRemoved", [5]]]]
    )
    batch = decode_payload(payload)
    assert batch.events == (BlockStored((5,), None, 2, 2), BlockRemoved((5,)))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"\xc1", "not msgpack"),
        (msgspec.msgpack.encode({"ts": 1}), "array"),
        (msgspec.msgpack.encode(["x", []]), "ts"),
        (msgspec.msgpack.encode([1, [{"block_hashes": [1]}]]), "type"),
        (msgspec.msgpack.encode([1, [{"type": "BlockStored", "block_hashes": [1]}]]), "lacks"),
        (msgspec.msgpack.encode([1, [["BlockRemoved", ["x"]]]]), "int or bytes"),
        (msgspec.msgpack.encode([1, [["BlockStored", [1], None, [], 0]]]), "block_size"),
        (msgspec.msgpack.encode([1, [7]]), "tagged"),
    ],
)
def test_a_bad_payload_says_what_is_wrong(payload, message):
    with pytest.raises(KvEventDecodeError, match=message):
        decode_payload(payload)


def test_a_bad_sequence_frame_is_refused():
    with pytest.raises(KvEventDecodeError, match="8"):
        decode_frames([b"", b"\x01", msgspec.msgpack.encode([1, []])])
    with pytest.raises(KvEventDecodeError, match="empty"):
        decode_frames([])


# -- the tracker --------------------------------------------------------------------------------
SYSTEM = "You are the ACME support assistant. Answer briefly and politely. " * 16  # 1,056 chars


def _stored(parent, hashes, block_size=16):
    return KvEventBatch(-1, 0.0, (BlockStored(tuple(hashes), parent, block_size, 0),))


def _batch(*events):
    return KvEventBatch(-1, 0.0, tuple(events))


def _tracker(**kw):
    approximate = PrefixIndex()
    return KvEventTracker(approximate=approximate, **kw), approximate


def test_stored_events_map_engine_blocks_onto_the_dispatched_prompts_router_blocks():
    tracker, _ = _tracker()  # 256-character router blocks = 64 tokens = 4 engine blocks
    prompt = block_hashes(SYSTEM + "Where is my parcel?")  # 4 full router blocks
    assert len(prompt) == 4
    tracker.set_connected(1, True)
    tracker.note_dispatch(1, prompt, now=0.0)
    tracker.apply(1, _stored(None, range(100, 109)), now=0.1)  # 9 engine blocks: 144 tokens
    assert tracker.precise(1, 0.1)
    assert tracker.match(prompt, 0.1, [1]) == {1: 2}  # 144 tokens * 4 = 576 chars: 2 blocks
    tracker.apply(1, _stored(108, range(109, 117)), now=0.2)  # the next chunk: 272 tokens
    assert tracker.match(prompt, 0.2, [1]) == {1: 4}
    assert tracker.sizes()[1] == (17, 0)  # all its blocks reported: no longer pending


def test_a_second_prompt_sharing_the_prefix_continues_from_the_shared_block():
    tracker, _ = _tracker()
    first = block_hashes(SYSTEM + "a" * 300)
    second = block_hashes(SYSTEM + "b" * 300)
    tracker.note_dispatch(1, first, now=0.0)
    tracker.apply(1, _stored(None, range(100, 121)), now=0.1)  # 21 blocks = 336 tokens: all 5
    tracker.note_dispatch(1, second, now=0.2)
    assert tracker.match(second, 0.2, [1]) == {1: 4}  # the shared system prompt
    # The engine hit 16 blocks (4 router blocks) and stores from the 16th on.
    tracker.apply(1, _stored(115, range(200, 205)), now=0.3)
    assert tracker.match(second, 0.3, [1]) == {1: 5}
    assert tracker.match(first, 0.3, [1]) == {1: 5}


def test_removed_blocks_drop_precise_router_blocks_and_bound_the_approximate_index():
    tracker, approximate = _tracker()
    prompt = block_hashes(SYSTEM)  # 4 router blocks, 16 engine blocks
    approximate.record(1, prompt, 0.0)
    tracker.note_dispatch(1, prompt, now=0.0)
    tracker.apply(1, _stored(None, range(100, 117)), now=0.1)
    assert tracker.match(prompt, 0.1, [1]) == {1: 4}
    assert tracker.capacity(1) is None  # no eviction yet: the cache may not be full
    # Tail first, as vLLM evicts: engine blocks 116..111; 111 completed router block 3.
    tracker.apply(1, _batch(BlockRemoved(tuple(range(116, 110, -1)))), now=0.2)
    assert tracker.precise_index.match(prompt, 0.2, [1]) == {1: 2}
    # The eviction reveals the capacity: 17 engine blocks = 272 tokens = 4 router blocks. The
    # approximate index is bounded to it, not told the removals; the belief is the larger.
    assert tracker.capacity(1) == 4
    assert approximate.match(prompt, 0.2, [1]) == {1: 4}
    assert tracker.match(prompt, 0.2, [1]) == {1: 4}
    tracker.apply(1, _batch(AllCleared()), now=0.3)
    assert tracker.match(prompt, 0.3, [1]) == {}
    assert approximate.match(prompt, 0.3, [1]) == {}


def test_events_that_stop_fall_back_to_the_approximate_index_and_resume():
    tracker, approximate = _tracker(stale_s=5.0)
    cached = block_hashes(SYSTEM)
    tracker.note_dispatch(1, cached, now=0.0)
    tracker.apply(1, _stored(None, range(100, 117)), now=0.1)
    fresh = block_hashes("x" * 1024)
    approximate.record(1, fresh, 1.0)  # what the router learned at dispatch
    tracker.note_dispatch(1, fresh, now=1.0)  # the engine must store its first block
    assert tracker.match(fresh, 5.9, [1]) == {}  # precise: not stored yet
    assert tracker.precise(1, 5.9)
    assert not tracker.precise(1, 6.1)  # unanswered for 5 s: approximate
    assert tracker.match(fresh, 6.1, [1]) == {1: 4}
    tracker.apply(1, _stored(None, range(300, 317)), now=7.0)  # events resume
    assert tracker.precise(1, 7.0)
    assert tracker.match(fresh, 7.0, [1]) == {1: 4}
    tracker.set_connected(1, False)  # the socket dropped
    assert not tracker.precise(1, 7.1)
    approximate.forget(1)
    assert tracker.match(cached, 7.1, [1]) == {}  # nothing approximate either


def test_an_idle_engine_stays_precise_and_a_fully_cached_prompt_expects_nothing():
    tracker, _ = _tracker(stale_s=1.0)
    prompt = block_hashes(SYSTEM)
    tracker.note_dispatch(1, prompt, now=0.0)
    tracker.apply(1, _stored(None, range(100, 117)), now=0.1)
    tracker.note_dispatch(1, prompt, now=0.2)  # held in full: it waits, expecting nothing
    assert tracker.sizes()[1] == (17, 1)
    assert tracker.precise(1, 100.0)
    # The engine stores nothing for it; the next prompt's blocks tell it never will.
    tracker.note_dispatch(1, block_hashes("z" * 300), now=100.0)
    tracker.apply(1, _stored(None, range(300, 304)), now=100.1)
    assert tracker.sizes()[1] == (21, 0)


def test_a_chain_the_router_never_mapped_is_ignored_and_memory_is_bounded():
    tracker, _ = _tracker(max_engine_blocks=8, max_pending=2)
    tracker.apply(1, _stored(999, range(5)), now=0.0)  # unknown parent
    tracker.apply(1, _stored(None, range(5)), now=0.0)  # nothing pending
    assert tracker.sizes()[1] == (0, 0)
    for n in range(5):
        tracker.note_dispatch(1, block_hashes(str(n) * 600), now=0.0)
    assert tracker.sizes()[1] == (0, 2)
    tracker.apply(1, _stored(None, range(100, 120)), now=0.1)
    assert tracker.sizes()[1][0] == 8
    tracker.retain([])
    assert tracker.sizes() == {}


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="block_chars"):
        KvEventTracker(block_chars=0)
    with pytest.raises(ValueError, match="stale_s"):
        KvEventTracker(stale_s=0)


def test_the_snapshots_live_endpoints_with_an_address_are_subscribed():
    endpoints = {
        1: endpoint_snap(1, kv_events="tcp://h1:5557"),
        2: endpoint_snap(2),  # no events: approximate only
        3: endpoint_snap(3, kv_events="tcp://h3:5557", state="gone"),
    }
    assert snapshot_addresses(Snapshot(version=1, created_at=0.0, endpoints=endpoints)) == {1: "tcp://h1:5557"}


def test_the_evented_index_answers_precisely_where_events_flow_else_approximately():
    index = EventedPrefixIndex()
    prompt = block_hashes(SYSTEM)
    index.record(1, prompt, 0.0)  # a dispatch: approximate, and pending for the tracker
    index.record(2, prompt, 0.0)
    assert index.match(prompt, 0.1) == {1: 4, 2: 4}  # no events yet: both approximate
    index.tracker.apply(1, _batch(AllCleared()), now=0.2)  # endpoint 1's engine reports
    assert index.match(prompt, 0.2) == {2: 4}  # 1 is precise and holds nothing
    index.tracker.apply(1, _stored(None, range(100, 117)), now=0.3)  # it stores the prompt
    assert index.match(prompt, 0.3, [1]) == {1: 4}


# -- generated blocks: a finished request's answer, cached after its prompt ----------------------
# 1,356 characters = 339 tokens: 21 full engine blocks (336 tokens), 5 full router blocks (1,280
# characters); the last engine block completes no router block (it ends at 1,344 characters).
ASKED = SYSTEM + "q" * 300
ANSWER = "a" * 400  # 100 generated tokens: the prompt and answer make 27 full engine blocks


def test_generated_blocks_are_never_attributed_to_another_pending_prompt():
    tracker, _ = _tracker()
    tracker.set_connected(1, True)
    first = block_hashes(ASKED)
    other = block_hashes("x" * 1400)  # another tenant's prompt: 5 router blocks, nothing shared
    assert len(first) == len(other) == 5
    tracker.note_dispatch(1, first, now=0.0)
    tracker.note_dispatch(1, other, now=0.0)  # queued in the engine behind the first
    # The first prompt's chunked prefill: 8 + 8 + 5 engine blocks, each chunk continuing the last.
    tracker.apply(1, _stored(None, range(100, 108)), now=0.1)
    tracker.apply(1, _stored(107, range(108, 116)), now=0.2)
    tracker.apply(1, _stored(115, range(116, 121)), now=0.3)
    assert tracker.match(first, 0.3, [1]) == {1: 5}
    assert tracker.sizes()[1] == (21, 1)  # the first is answered; the other still waits
    # Its answer's full blocks (as vLLM caches them while decoding, or the simulator when the
    # sequence leaves): engine blocks 22..27, continuing the prompt's last block.
    tracker.apply(1, _stored(120, range(121, 124)), now=0.4)
    tracker.apply(1, _stored(123, range(124, 127)), now=0.5)
    assert tracker.match(other, 0.5, [1]) == {}  # not the other prompt's blocks
    assert tracker.match(first, 0.5, [1]) == {1: 5}
    assert tracker.sizes()[1] == (27, 1)  # mapped (as the first's), the other still pending
    # The other prompt's own prefill is still attributed to it.
    tracker.apply(1, _stored(None, range(200, 221)), now=0.6)
    assert tracker.match(other, 0.6, [1]) == {1: 5}
    assert tracker.sizes()[1] == (48, 0)


def test_the_next_turn_continuing_the_answer_learns_the_history_the_engine_holds():
    tracker, approximate = _tracker()
    tracker.set_connected(1, True)
    first = block_hashes(ASKED)
    tracker.note_dispatch(1, first, now=0.0)
    approximate.record(1, first, 0.0)  # what the router learns at dispatch, in both modes
    tracker.apply(1, _stored(None, range(100, 121)), now=0.1)
    tracker.apply(1, _stored(120, range(121, 127)), now=0.2)  # the answer's blocks
    # The next turn: the history (prompt + answer) and a new message, 2,256 characters.
    following = block_hashes(ASKED + ANSWER + "u" * 500)
    assert len(following) == 8
    assert following[:5] == first
    # Before it is sent neither index knows the answer's router blocks (the router never saw
    # the answer's text as blocks): both give the prompt's 5.
    assert tracker.match(following, 0.3, [1]) == {1: 5}
    assert approximate.match(following, 0.3, [1]) == {1: 5}
    unrelated = block_hashes("y" * 1400)
    tracker.note_dispatch(1, following, now=0.3)
    tracker.note_dispatch(1, unrelated, now=0.3)  # waits behind it
    # The engine hits the 27 cached blocks (history) and stores 28..35 after the answer's last.
    tracker.apply(1, _stored(126, range(127, 135)), now=0.4)
    assert tracker.match(following, 0.4, [1]) == {1: 8}
    assert tracker.match(unrelated, 0.4, [1]) == {}
    assert tracker.sizes()[1] == (35, 1)  # the unrelated prompt still waits for its own blocks


def test_a_prompt_branching_off_a_prefill_in_progress_is_its_own():
    tracker, _ = _tracker()
    first = block_hashes(SYSTEM + "a" * 600)  # 6 router blocks, 25 engine blocks
    second = block_hashes(SYSTEM + "b" * 300)
    tracker.note_dispatch(1, first, now=0.0)
    tracker.note_dispatch(1, second, now=0.0)
    tracker.apply(1, _stored(None, range(100, 120)), now=0.1)  # the first's first chunk: 20
    assert tracker.match(first, 0.1, [1]) == {1: 5}  # 320 tokens: 5 of its 6 router blocks
    # The second shares the system prompt's 16 blocks and stores from there, mid-chain of the
    # first (whose prompt is not the second's past them).
    tracker.apply(1, _stored(115, range(200, 205)), now=0.2)
    assert tracker.match(second, 0.2, [1]) == {1: 5}
    assert tracker.sizes()[1] == (25, 1)  # the first still waits for its last chunk
    tracker.apply(1, _stored(119, range(120, 125)), now=0.3)
    assert tracker.match(first, 0.3, [1]) == {1: 6}
    assert tracker.sizes()[1] == (30, 0)


def test_generated_blocks_keep_the_engine_block_map_bounded_measured():
    bound = 4_096
    tracker = KvEventTracker(approximate=PrefixIndex(), max_engine_blocks=bound)
    engine = iter(range(1 << 40, 1 << 41))
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for request in range(2 * bound // 30):  # twice the bound: 12 prompt + 18 answer blocks
            tracker.note_dispatch(1, block_hashes(f"{request:08d}" * 100), now=request * 0.01)
            prompt = [next(engine) for _ in range(12)]  # 192 tokens: its 3 router blocks
            tracker.apply(1, _stored(None, prompt), now=request * 0.01)
            tracker.apply(1, _stored(prompt[-1], [next(engine) for _ in range(18)]), now=0.0)
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert tracker.sizes()[1] == (bound, 0)  # the answers' blocks are mapped, within the bound
    per_block = used / bound
    # CPython 3.11: a node (slots dataclass, 4 fields), its hash key and OrderedDict links, a
    # share of its prompt (router hashes and their positions) and of the precise index: ~290 B.
    assert 100 < per_block < 600, per_block
