"""The simulator's engine loop: admission, priority order, KV limits, aborts, timing."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import pytest_asyncio
from fixtures.wait import async_eventually

from runtime.workers.simulator.engine import Engine, SeqState, Sequence
from runtime.workers.simulator.timing import Capacity, TimingModel

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]

FAST = TimingModel(prefill_tps=1e9, decode_a_ms=1, decode_b_ms=0)


class Recorder:
    """An EngineObserver that keeps every event."""

    def __init__(self) -> None:
        self.admitted: list[str] = []
        self.tokens: list[tuple[str, bool, float]] = []
        self.finished: list[tuple[str, str]] = []

    def on_admitted(self, seq: Sequence, queue_seconds: float) -> None:
        self.admitted.append(seq.request_id)

    def on_token(self, seq: Sequence, latency_seconds: float, *, first: bool) -> None:
        self.tokens.append((seq.request_id, first, latency_seconds))

    def on_finished(self, seq: Sequence, reason: str, e2e_seconds: float) -> None:
        self.finished.append((seq.request_id, reason))


@pytest_asyncio.fixture
async def make_engine():
    engines: list[Engine] = []

    def _make(timing: TimingModel = FAST, **capacity: int) -> tuple[Engine, Recorder]:
        recorder = Recorder()
        engine = Engine(timing=timing, capacity=Capacity(**capacity), observer=recorder)
        engine.start()
        engines.append(engine)
        return engine, recorder

    yield _make
    for engine in engines:
        await engine.stop()


def submit(engine: Engine, rid: str, *, prompt: int = 10, tokens: int = 3, priority: int = 0,
           reason: str = "length") -> Sequence:  # fmt: skip
    words = (f" {rid}{i}" for i in itertools.count())
    return engine.submit(
        request_id=rid, prompt_tokens=prompt, max_tokens=tokens, output_tokens=tokens,
        finish_reason=reason, priority=priority, words=words,
    )  # fmt: skip


async def drain(seq: Sequence) -> list[str]:
    out: list[str] = []
    while (tokens := await seq.next_tokens()) is not None:
        out.extend(tokens)
    return out


async def test_sequence_gets_exactly_its_tokens_then_finishes(make_engine):
    engine, recorder = make_engine()
    seq = submit(engine, "a", tokens=5)
    assert await drain(seq) == [" a0", " a1", " a2", " a3", " a4"]
    assert seq.state is SeqState.FINISHED
    assert recorder.finished == [("a", "length")]
    assert [first for _, first, _ in recorder.tokens] == [True, False, False, False, False]
    assert (engine.num_running, engine.num_waiting, engine.kv_used_tokens) == (0, 0, 0)


async def test_waiting_queue_serves_lower_priority_value_first_then_arrival(make_engine):
    engine, recorder = make_engine(max_num_seqs=1)
    first = submit(engine, "first", tokens=5)
    await async_eventually(lambda: engine.num_running == 1, timeout=2.0, interval=0.001)
    seqs = [
        submit(engine, "low", priority=10),
        submit(engine, "high-1", priority=-1),
        submit(engine, "mid", priority=0),
        submit(engine, "high-2", priority=-1),
    ]
    assert engine.num_running == 1
    assert engine.num_waiting == 4
    await asyncio.gather(drain(first), *(drain(s) for s in seqs))
    assert recorder.admitted == ["first", "high-1", "high-2", "mid", "low"]


async def test_kv_capacity_blocks_admission_and_head_of_line(make_engine):
    engine, recorder = make_engine(max_num_seqs=8, kv_capacity_tokens=100)
    big = submit(engine, "big", prompt=50, tokens=20)  # reserves 70
    await async_eventually(lambda: engine.num_running == 1, timeout=2.0, interval=0.001)
    blocked = submit(engine, "blocked", prompt=30, tokens=10)  # 40: does not fit next to 70
    small = submit(engine, "small", prompt=10, tokens=5)  # 15 would fit, but waits its turn
    await asyncio.sleep(0.005)  # a few engine steps: nothing may be admitted (a negative check)
    assert engine.num_running == 1
    assert engine.num_waiting == 2
    assert engine.kv_used_tokens == 70
    assert engine.kv_usage == pytest.approx(0.7)
    await asyncio.gather(drain(big), drain(blocked), drain(small))
    assert recorder.admitted == ["big", "blocked", "small"]


async def test_abort_running_frees_slot_and_kv_at_once(make_engine):
    engine, recorder = make_engine(max_num_seqs=1)
    running = submit(engine, "running", tokens=10_000)
    waiting = submit(engine, "waiting", tokens=2)
    assert await running.next_tokens()
    assert engine.num_waiting == 1
    engine.abort(running)
    assert engine.num_running == 0
    assert engine.kv_used_tokens == 0
    assert await running.next_tokens() is None
    assert running.state is SeqState.ABORTED
    assert await drain(waiting) == [" waiting0", " waiting1"]
    assert ("running", "abort") in recorder.finished
    engine.abort(running)  # idempotent
    engine.abort(waiting)  # finished: a no-op
    assert recorder.finished.count(("running", "abort")) == 1
    assert waiting.state is SeqState.FINISHED


async def test_abort_waiting_drops_it_from_the_queue(make_engine):
    engine, recorder = make_engine(max_num_seqs=1)
    running = submit(engine, "running", tokens=50)
    await async_eventually(lambda: engine.num_running == 1, timeout=2.0, interval=0.001)
    waiting = submit(engine, "waiting")
    assert engine.num_waiting == 1
    engine.abort(waiting)
    assert engine.num_waiting == 0
    assert await waiting.next_tokens() is None
    await drain(running)
    assert "waiting" not in recorder.admitted


async def test_zero_output_sequence_finishes_after_its_prefill_step(make_engine):
    engine, recorder = make_engine()
    seq = submit(engine, "embed", prompt=100, tokens=0, reason="stop")
    assert await drain(seq) == []
    assert recorder.finished == [("embed", "stop")]
    assert recorder.tokens == []


async def test_step_time_follows_the_timing_model(make_engine):
    timing = TimingModel(prefill_tps=1000, decode_a_ms=20, decode_b_ms=0)
    engine, recorder = make_engine(timing)
    loop = asyncio.get_running_loop()
    start = loop.time()
    seq = submit(engine, "a", prompt=100, tokens=5)  # 0.1 s prefill + 5 x 20 ms decode
    await drain(seq)
    assert loop.time() - start >= 0.2 - 0.01
    first_latency = recorder.tokens[0][2]
    later = [latency for _, first, latency in recorder.tokens if not first]
    assert first_latency >= 0.12 - 0.005
    # Steps keep a drift-free schedule: a late step shortens the next one (the catch-up), so a
    # single gap may be short, but no token arrives before the model's time for it.
    arrivals = list(itertools.accumulate(later, initial=first_latency))
    assert all(at >= 0.12 + 0.02 * k - 0.005 for k, at in enumerate(arrivals)), arrivals
    assert engine.steps == 5


async def test_decode_step_grows_with_batch_size(make_engine):
    engine, _ = make_engine(TimingModel(prefill_tps=1e9, decode_a_ms=0, decode_b_ms=10))
    loop = asyncio.get_running_loop()
    start = loop.time()
    await drain(submit(engine, "alone", tokens=5))  # 5 steps of 10 ms
    alone = loop.time() - start
    start = loop.time()
    await asyncio.gather(*(drain(submit(engine, f"b{i}", tokens=5)) for i in range(4)))
    batched = loop.time() - start  # 5 steps of 40 ms
    assert alone >= 0.05 - 0.005
    assert batched >= 0.2 - 0.005
    assert batched > alone


async def test_stop_ends_every_sequence(make_engine):
    engine, _ = make_engine(max_num_seqs=1)
    running = submit(engine, "running", tokens=10_000)
    waiting = submit(engine, "waiting")
    await running.next_tokens()
    await engine.stop()
    assert await drain(running) == []
    assert await waiting.next_tokens() is None
    assert (engine.num_running, engine.num_waiting) == (0, 0)


async def test_submit_rejects_impossible_requests(make_engine):
    engine, _ = make_engine(kv_capacity_tokens=100)
    with pytest.raises(ValueError, match="KV"):
        submit(engine, "huge", prompt=90, tokens=20)
    with pytest.raises(ValueError, match="output_tokens"):
        engine.submit(
            request_id="x", prompt_tokens=1, max_tokens=1, output_tokens=2,
            finish_reason="length", priority=0, words=iter(()),
        )  # fmt: skip
