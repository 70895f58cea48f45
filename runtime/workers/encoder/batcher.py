"""The worker-side dynamic batcher (docs/design.md).

Jobs (one input each: its task, token ids, absolute deadline) wait in groups keyed by task and
length bucket, so short inputs are not padded to long ones. A group is released when the first
of these comes:

- **size cap**: it holds ``max_batch`` jobs;
- **wait cap**: its oldest job has waited ``W`` with ``W = min(max_wait, SLO - t(n, L) -
  margin)`` for the group's ``n`` inputs padded to ``L``, where ``t`` is the worker's measured
  :class:`~.cost.ComputeModel`;
- **deadline**: the earliest deadline in the group minus the predicted compute minus margin.

Within a released group the earliest deadlines go first. :class:`BatchQueue` is the pure
decision logic (injected clock, no I/O); :class:`DynamicBatcher` runs it on the event loop and
computes batches one at a time in a worker thread. A batch that raises is retried input by
input, so one bad input fails alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from runtime.workers.encoder.cost import ComputeModel

RunBatch = Callable[[str, list[list[int]]], list[Any]]
"""Blocking compute: ``(task, token id lists) -> one result per input``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchPolicy:
    max_batch: int = 32
    max_wait_s: float = 0.010
    margin_s: float = 0.005
    slo_s: float = 0.200  # the class SLO when a request brings no deadline of its own
    min_bucket: int = 16  # the smallest length bucket (tokens)
    enabled: bool = True  # False: every job is its own batch, at once

    def __post_init__(self) -> None:
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if self.max_wait_s < 0 or self.margin_s < 0 or self.slo_s <= 0:
            raise ValueError("max_wait_s and margin_s must be >= 0, slo_s > 0")


def length_bucket(length: int, min_bucket: int = 16) -> int:
    """The power of two at or above ``length`` (at least ``min_bucket``)."""
    bucket = max(1, min_bucket)
    while bucket < length:
        bucket *= 2
    return bucket


@dataclass(eq=False, slots=True)
class Job:
    task: str
    ids: list[int]
    deadline: float
    enqueued: float
    seq: int = 0
    future: asyncio.Future[Any] | None = None


@dataclass(frozen=True, slots=True)
class Batch:
    task: str
    jobs: tuple[Job, ...]
    reason: str  # "size" | "wait" | "deadline" | "off" | "drain"

    @property
    def seq_len(self) -> int:
        return max(len(job.ids) for job in self.jobs)


@dataclass(slots=True)
class BatchQueue:
    """Groups jobs and decides when to release which batch. Not thread-safe; no I/O."""

    policy: BatchPolicy
    cost: ComputeModel = field(default_factory=ComputeModel)
    _groups: dict[tuple[str, int], list[Job]] = field(default_factory=dict)
    _seq: int = 0

    def __len__(self) -> int:
        return sum(len(jobs) for jobs in self._groups.values())

    def add(self, job: Job) -> None:
        self._seq += 1
        job.seq = self._seq
        key = (job.task, length_bucket(len(job.ids), self.policy.min_bucket))
        self._groups.setdefault(key, []).append(job)

    def wait_cap(self, seq_len: int, batch: int | None = None) -> float:
        """``W = min(max_wait, SLO - t(n, L) - margin)`` for a batch of ``n`` (default the size
        cap), never below zero. A group's cap is taken at its current size, so it shrinks as
        the group grows."""
        policy = self.policy
        n = policy.max_batch if batch is None else max(1, min(batch, policy.max_batch))
        budget = policy.slo_s - self.cost.predict(n, seq_len) - policy.margin_s
        return max(0.0, min(policy.max_wait_s, budget))

    def _release_at(self, key: tuple[str, int], jobs: list[Job]) -> tuple[float, str]:
        policy = self.policy
        if not policy.enabled:
            return -float("inf"), "off"
        if len(jobs) >= policy.max_batch:
            return -float("inf"), "size"
        seq_len = max(len(job.ids) for job in jobs)
        oldest = min(job.enqueued for job in jobs)
        by_wait = oldest + self.wait_cap(key[1], len(jobs))
        earliest = min(job.deadline for job in jobs)
        by_deadline = earliest - self.cost.predict(len(jobs), seq_len) - policy.margin_s
        if by_deadline < by_wait:
            return by_deadline, "deadline"
        return by_wait, "wait"

    def next_release(self) -> float | None:
        """When the next batch is due (clock time; maybe in the past); None when empty."""
        times = [self._release_at(key, jobs)[0] for key, jobs in self._groups.items() if jobs]
        return min(times) if times else None

    def take(self, now: float, *, force: bool = False) -> Batch | None:
        """The batch due at ``now`` (the most overdue group), or None. ``force``: any group."""
        best: tuple[float, int, tuple[str, int], str] | None = None
        for key, jobs in self._groups.items():
            if not jobs:
                continue
            at, reason = self._release_at(key, jobs)
            if not force and at > now:
                continue
            rank = (at, min(job.seq for job in jobs), key, "drain" if force else reason)
            if best is None or rank[:2] < best[:2]:
                best = rank
        if best is None:
            return None
        _, _, key, reason = best
        jobs = self._groups[key]
        limit = 1 if not self.policy.enabled else self.policy.max_batch
        jobs.sort(key=lambda job: (job.deadline, job.seq))
        chosen, rest = jobs[:limit], jobs[limit:]
        if rest:
            self._groups[key] = rest
        else:
            del self._groups[key]
        return Batch(task=key[0], jobs=tuple(chosen), reason=reason)

    def drop(self, job: Job) -> bool:
        """Remove a job still waiting (its client gave up); True if it was there."""
        key = (job.task, length_bucket(len(job.ids), self.policy.min_bucket))
        jobs = self._groups.get(key)
        if jobs is None or job not in jobs:
            return False
        jobs.remove(job)
        if not jobs:
            del self._groups[key]
        return True


class BatchObserver(Protocol):
    def on_batch(self, batch: Batch, seconds: float, max_batch: int) -> None: ...


class DynamicBatcher:
    """Runs a :class:`BatchQueue` on the event loop; one batch computes at a time."""

    def __init__(
        self,
        run: RunBatch,
        *,
        policy: BatchPolicy,
        cost: ComputeModel | None = None,
        observer: BatchObserver | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._run = run
        self.policy = policy
        self.queue = BatchQueue(policy, cost or ComputeModel())
        self.observer = observer
        self._clock = clock
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.running = 0  # inputs in the batch being computed

    @property
    def cost(self) -> ComputeModel:
        return self.queue.cost

    @property
    def waiting(self) -> int:
        return len(self.queue)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="encoder-batcher")

    async def stop(self) -> None:
        """Cancel the loop; jobs still waiting fail with CancelledError."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        while (batch := self.queue.take(self._clock(), force=True)) is not None:
            for job in batch.jobs:
                if job.future is not None and not job.future.done():
                    job.future.cancel()

    async def submit(self, task: str, ids: list[int], *, deadline: float | None = None) -> Any:
        """Queue one input and wait for its result (the compute's exception if it failed)."""
        now = self._clock()
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        job = Job(
            task=task,
            ids=ids,
            deadline=now + self.policy.slo_s if deadline is None else deadline,
            enqueued=now,
            future=future,
        )
        self.queue.add(job)
        self._wake.set()
        try:
            return await future
        except asyncio.CancelledError:
            self.queue.drop(job)
            raise

    async def submit_many(
        self, task: str, inputs: Sequence[list[int]], *, deadline: float | None = None
    ) -> list[Any]:
        """Queue several inputs (one request); results in order, or the first exception."""
        return list(
            await asyncio.gather(*(self.submit(task, ids, deadline=deadline) for ids in inputs))
        )

    async def _loop(self) -> None:
        while True:
            now = self._clock()
            batch = self.queue.take(now)
            if batch is None:
                due = self.queue.next_release()
                self._wake.clear()
                timeout = None if due is None else max(0.0, due - now)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout)
                continue
            await self._compute(batch)

    async def _compute(self, batch: Batch) -> None:
        jobs = [job for job in batch.jobs if job.future is None or not job.future.done()]
        if not jobs:
            return
        inputs = [job.ids for job in jobs]
        self.running = len(jobs)
        started = time.perf_counter()
        try:
            outcomes = await asyncio.to_thread(_run_isolated, self._run, batch.task, inputs)
        finally:
            self.running = 0
        seconds = time.perf_counter() - started
        if all(not isinstance(outcome, BaseException) for outcome in outcomes):
            self.cost.observe(len(inputs), max(len(ids) for ids in inputs), seconds)
        if self.observer is not None:
            self.observer.on_batch(batch, seconds, self.policy.max_batch)
        for job, outcome in zip(jobs, outcomes, strict=True):
            future = job.future
            if future is None or future.done():
                continue
            if isinstance(outcome, BaseException):
                future.set_exception(outcome)
            else:
                future.set_result(outcome)


def _run_isolated(run: RunBatch, task: str, inputs: list[list[int]]) -> list[Any]:
    """Run the batch; if it raises, run each input alone so only the bad ones fail."""
    try:
        results = run(task, inputs)
    except Exception as exc:
        if len(inputs) == 1:
            return [exc]
    else:
        if len(results) != len(inputs):
            raise RuntimeError(f"the model returned {len(results)} results for {len(inputs)}")
        return results
    outcomes: list[Any] = []
    for ids in inputs:
        try:
            outcomes.extend(run(task, [ids]))
        except Exception as exc:
            outcomes.append(exc)
    return outcomes
