"""The simulator's engine: a waiting queue, a running batch and one step loop.

Requests enter the waiting queue, ordered by ``priority`` (lower first, as vLLM's priority
scheduler) then arrival. At the start of every step the loop admits from the head of the queue
while the batch has room (``Capacity.admits``); admission stops at the first request that does
not fit, so a large request is never overtaken by smaller ones behind it. Each step lasts
``TimingModel.step_seconds`` and gives one token to every running sequence. A sequence leaves
the batch when it has produced its tokens or when it is aborted (client gone); its KV
reservation is freed at once. With a prefix cache (``prefix_cache.PrefixCache``), a request's
prompt tokens found in the cache at admission are not prefilled: the step pays only the
uncached ones; when a sequence leaves the batch, the full blocks of its rendered prompt
followed by the text it generated are cached (a resumed stream's continuation on the same
engine hits them, as on vLLM).

The clock: steps are scheduled against a monotonic deadline, not slept one after another.
While the batch is busy, step ``k`` ends at ``t0 + sum(step durations so far)`` where ``t0``
is when the engine last left idle; a step that wakes late (the process starved for CPU, the
GIL held by another thread) is not stretched — the next one is shortened to catch up, so CPU
contention delays a token by at most the wake-up latency of that one step and never
accumulates into the step rate. A wake-up later than ``MAX_CATCH_UP_SECONDS`` (the process
was stopped, or a stall much longer than any step) restarts the schedule from now instead of
bursting through the missed steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import heapq
import itertools
import logging
from collections.abc import Iterator
from typing import Protocol

from runtime.workers.simulator.prefix_cache import PrefixCache, text_block_hashes
from runtime.workers.simulator.timing import Capacity, TimingModel

logger = logging.getLogger(__name__)

# A step that starts at most this late continues from the previous step's deadline (the
# missed time is caught up by the following steps); later than that, the schedule restarts.
MAX_CATCH_UP_SECONDS = 1.0


class SeqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"
    ABORTED = "aborted"


class Sequence:
    """One request inside the engine; its handler reads tokens with ``next_tokens()``."""

    __slots__ = (
        "_queue",
        "admitted_at",
        "arrived_at",
        "block_hashes",
        "cached_tokens",
        "finish_reason",
        "first_token_at",
        "generated",
        "last_token_at",
        "max_tokens",
        "output_tokens",
        "priority",
        "prompt_tokens",
        "rendered",
        "request_id",
        "state",
        "text",
        "words",
    )

    def __init__(
        self,
        *,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        output_tokens: int,
        finish_reason: str,
        priority: int,
        words: Iterator[str],
        arrived_at: float,
        block_hashes: tuple[int, ...] = (),
        rendered: str = "",
    ) -> None:
        self.request_id = request_id
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.output_tokens = output_tokens
        self.finish_reason = finish_reason
        self.priority = priority
        self.words = words
        self.arrived_at = arrived_at
        self.block_hashes = block_hashes
        self.rendered = rendered  # the prompt as 4-character tokens; "" when not cached as text
        self.text: list[str] = []  # the generated tokens' text, kept only with ``rendered``
        self.cached_tokens = 0  # prompt tokens found in the prefix cache at admission
        self.admitted_at: float | None = None
        self.first_token_at: float | None = None
        self.last_token_at: float | None = None
        self.generated = 0
        self.state = SeqState.WAITING
        self._queue: asyncio.Queue[str | None] = asyncio.Queue()

    @property
    def kv_tokens(self) -> int:
        """KV tokens reserved while running: the prompt plus the whole output budget."""
        return self.prompt_tokens + self.max_tokens

    @property
    def done(self) -> bool:
        return self.state in (SeqState.FINISHED, SeqState.ABORTED)

    async def next_tokens(self) -> list[str] | None:
        """The tokens produced since the last call (waits for at least one); None at the end."""
        item = await self._queue.get()
        if item is None:
            return None
        tokens = [item]
        while not self._queue.empty():
            more = self._queue.get_nowait()
            if more is None:
                self._queue.put_nowait(None)  # keep the end marker for the next call
                break
            tokens.append(more)
        return tokens

    def _push(self, item: str | None) -> None:
        self._queue.put_nowait(item)


class EngineObserver(Protocol):
    """Receives the engine's events (the Prometheus metrics implement it)."""

    def on_admitted(self, seq: Sequence, queue_seconds: float) -> None: ...

    def on_token(self, seq: Sequence, latency_seconds: float, *, first: bool) -> None: ...

    def on_finished(self, seq: Sequence, reason: str, e2e_seconds: float) -> None: ...


class Engine:
    """The scheduler loop; ``start()`` it inside a running event loop, ``stop()`` at shutdown."""

    def __init__(
        self,
        *,
        timing: TimingModel,
        capacity: Capacity,
        observer: EngineObserver | None = None,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.timing = timing
        self.capacity = capacity
        self.prefix_cache = prefix_cache
        self._observer = observer
        self._order = itertools.count()
        self._heap: list[tuple[int, int, Sequence]] = []
        self._num_waiting = 0
        self._running: dict[int, Sequence] = {}
        self._kv_used = 0
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._deadline: float | None = None  # end of the current step; None while idle
        self.steps = 0

    # -- state, read by /metrics and tests -------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def kv_used_tokens(self) -> int:
        return self._kv_used

    @property
    def kv_usage(self) -> float:
        return self.capacity.kv_usage(self._kv_used)

    # -- lifecycle ---------------------------------------------------------------------------
    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop(), name="sim-engine")
            self._task.add_done_callback(_log_crash)

    async def stop(self) -> None:
        """Stop the loop and abort every sequence, so no handler waits forever."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        for seq in [entry[2] for entry in self._heap] + list(self._running.values()):
            self.abort(seq)

    # -- requests ----------------------------------------------------------------------------
    def submit(
        self,
        *,
        request_id: str,
        prompt_tokens: int,
        max_tokens: int,
        output_tokens: int,
        finish_reason: str,
        priority: int,
        words: Iterator[str],
        block_hashes: tuple[int, ...] = (),
        rendered: str = "",
    ) -> Sequence:
        """Queue a request that will produce ``output_tokens`` (≤ ``max_tokens``) tokens.

        ``block_hashes``: the chained hashes of its prompt's full blocks (see
        :mod:`~runtime.workers.simulator.prefix_cache`); with a prefix cache, the cached ones
        are not prefilled again. ``rendered``: the text prompt those blocks cover (4-character
        tokens); with it, the blocks of the prompt followed by the generated text are cached
        when the sequence leaves the batch.
        """
        if not 0 <= output_tokens <= max_tokens:
            raise ValueError("need 0 <= output_tokens <= max_tokens")
        if prompt_tokens + max_tokens > self.capacity.kv_capacity_tokens:
            raise ValueError("request needs more KV tokens than the whole cache holds")
        seq = Sequence(
            request_id=request_id,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            output_tokens=output_tokens,
            finish_reason=finish_reason,
            priority=priority,
            words=words,
            arrived_at=asyncio.get_running_loop().time(),
            block_hashes=block_hashes,
            rendered=rendered,
        )
        heapq.heappush(self._heap, (priority, next(self._order), seq))
        self._num_waiting += 1
        self._wakeup.set()
        return seq

    def abort(self, seq: Sequence) -> None:
        """Remove ``seq`` now, wherever it is; a no-op once it has finished."""
        if seq.done:
            return
        if seq.state is SeqState.WAITING:
            self._num_waiting -= 1  # its heap entry is skipped lazily
        else:
            self._release(seq)
        seq.state = SeqState.ABORTED
        seq._push(None)
        self._notify_finished(seq, "abort")

    # -- the loop ----------------------------------------------------------------------------
    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            prefill_tokens = self._admit(loop.time())
            if not self._running:
                self._deadline = None
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = list(self._running.values())
            duration = self.timing.step_seconds(
                batch_size=len(batch), prefill_tokens=prefill_tokens
            )
            now = loop.time()
            self._deadline = next_deadline(self._deadline, now, duration)
            await asyncio.sleep(max(0.0, self._deadline - now))
            self.steps += 1
            now = loop.time()
            for seq in batch:
                if seq.state is SeqState.RUNNING:
                    self._advance(seq, now)

    def _admit(self, now: float) -> int:
        """Move sequences from the queue head into the batch; returns their uncached prompt
        tokens (the prefill this step pays)."""
        prefill_tokens = 0
        while self._heap:
            seq = self._heap[0][2]
            if seq.state is not SeqState.WAITING:
                heapq.heappop(self._heap)
                continue
            if not self.capacity.admits(
                running=len(self._running), kv_used=self._kv_used, kv_needed=seq.kv_tokens
            ):
                break
            heapq.heappop(self._heap)
            self._num_waiting -= 1
            seq.state = SeqState.RUNNING
            seq.admitted_at = now
            self._running[id(seq)] = seq
            self._kv_used += seq.kv_tokens
            if self.prefix_cache is not None:
                seq.cached_tokens = self.prefix_cache.admit(seq.block_hashes, seq.prompt_tokens)
            prefill_tokens += seq.prompt_tokens - seq.cached_tokens
            if self._observer is not None:
                self._observer.on_admitted(seq, now - seq.arrived_at)
        return prefill_tokens

    def _advance(self, seq: Sequence, now: float) -> None:
        """One step's worth of progress for a running sequence."""
        if seq.generated < seq.output_tokens:
            first = seq.generated == 0
            previous = seq.arrived_at if seq.last_token_at is None else seq.last_token_at
            seq.generated += 1
            seq.last_token_at = now
            if first:
                seq.first_token_at = now
            word = next(seq.words)
            if seq.rendered:
                seq.text.append(word)
            seq._push(word)
            if self._observer is not None:
                self._observer.on_token(seq, now - previous, first=first)
        if seq.generated >= seq.output_tokens:
            self._release(seq)
            seq.state = SeqState.FINISHED
            seq._push(None)
            self._notify_finished(seq, seq.finish_reason)

    def _release(self, seq: Sequence) -> None:
        if self._running.pop(id(seq), None) is not None:
            self._kv_used -= seq.kv_tokens
            if self.prefix_cache is not None:
                self.prefix_cache.store(self._computed_blocks(seq))

    def _computed_blocks(self, seq: Sequence) -> tuple[int, ...]:
        """The full blocks a leaving sequence computed: its prompt's, then, for a text prompt,
        those of the prompt followed by the text generated (as vLLM keeps them cached)."""
        if not seq.rendered or not seq.text or self.prefix_cache is None:
            return seq.block_hashes
        return text_block_hashes(
            seq.rendered + "".join(seq.text),
            self.prefix_cache.config.block_size,
            known=seq.block_hashes,
        )

    def _notify_finished(self, seq: Sequence, reason: str) -> None:
        if self._observer is not None:
            loop = asyncio.get_running_loop()
            self._observer.on_finished(seq, reason, loop.time() - seq.arrived_at)


def next_deadline(previous: float | None, now: float, duration: float) -> float:
    """When a step of ``duration`` that starts now ends on the drift-free schedule.

    It starts where the previous step was due to end (``previous``), even when that has passed
    (a late wake-up is caught up by a shorter sleep), unless the engine was idle (``None``) or
    is more than ``MAX_CATCH_UP_SECONDS`` behind: then the schedule restarts from ``now``.
    """
    if previous is None or previous < now - MAX_CATCH_UP_SECONDS:
        return now + duration
    return previous + duration


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.error("simulator engine loop crashed", exc_info=task.exception())
