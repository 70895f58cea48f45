"""Fairness counters shared by router replicas through Redis, synchronised in batches.

Each router charges service to its local queues as usual (input tokens at dispatch, output
tokens as they stream) and also notes every charge here, as a delta per (pool, band, tenant).
A background task, every ``interval_s`` while any of the pool's queues holds requests (and
every ``idle_interval_s`` otherwise), sends one pipeline: an ``HINCRBYFLOAT`` per delta into
the pool's hash, then an ``HGETALL`` of the hashes of the contended pools (of every pool on
the slow beat). One round trip per interval, never one per token.

The task itself wakes every ``interval_s`` only while the router is active: some queue was
contended or some charge was recorded since its last wake-up. Otherwise it dozes until the
slow beat is due, and the next :meth:`SharedCounters.record` wakes it at once (an idle
router: one wake-up per ``idle_interval_s``, not ten). Contention starts with requests
arriving; while requests are dispatched or stream, charges keep the task on the fast beat.
A queue that fills while nothing at all is charged (every slot held by unary requests that
have not finished) is seen at the slow beat or the next charge, whichever comes first.

Merging: with ``G`` the global counter read back and ``p`` the deltas charged locally since
the pipeline was sent, the local counter is lifted to ``max(local, G + p)``
(``PoolQueue.lift_counter``): counters never fall, service done on other replicas counts here
within one interval, and a local lift (VTC's catch-up of a returning tenant) is kept. The
hash ``{prefix}:{pool}`` holds ``"<band>|<tenant>" -> counter``; it expires after ``ttl_s``
without any charge.

While Redis is unreachable, deltas accumulate (one float per key) and local fairness goes on;
the failure is logged once, and the recovery once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Protocol

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runtime.contract import FAIRNESS_PREFIX, fairness_key
from runtime.redis_conn import async_client, cancel_and_wait, raise_if_cancelling

logger = logging.getLogger(__name__)

Key = tuple[str, int, str]  # pool, band, tenant


class Participant(Protocol):
    """A pool dispatcher, as the synchroniser sees it."""

    def contended(self) -> bool: ...

    def lift(self, band: int, tenant: str, value: float) -> None: ...


class SharedCounters:
    """Implements :class:`runtime.scheduling.dispatcher.CounterSink`; see the module doc."""

    def __init__(
        self,
        redis_url: str,
        *,
        prefix: str = FAIRNESS_PREFIX,
        interval_s: float = 0.1,
        idle_interval_s: float = 1.0,
        ttl_s: int = 7 * 86400,
        timeout_s: float = 0.5,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not (interval_s > 0 and idle_interval_s >= interval_s):
            raise ValueError("need 0 < interval_s <= idle_interval_s")
        self._redis_url = redis_url
        self._prefix = prefix
        self._interval_s = interval_s
        self._idle_interval_s = idle_interval_s
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._clock = clock
        self._pending: dict[Key, float] = {}
        self._participants: dict[str, Participant] = {}
        self._client: aioredis.Redis[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._last_push = -float("inf")
        self._failing = False
        self._charged = False  # a charge was recorded since the task's last wake-up
        self._wake: asyncio.Event | None = None  # set while the task dozes
        self.syncs = 0  # round trips made (for tests and the curious)
        self.wakeups = 0  # the task's wake-ups (idem)

    def key(self, pool: str) -> str:
        return fairness_key(self._prefix, pool)

    def record(self, pool: str, band: int, tenant: str, amount: float) -> None:
        if amount > 0:
            key = (pool, band, tenant)
            self._pending[key] = self._pending.get(key, 0.0) + amount
            self._charged = True
            if self._wake is not None:
                self._wake.set()

    def attach(self, pool: str, participant: Participant) -> None:
        self._participants[pool] = participant

    def detach(self, pool: str, participant: Participant) -> None:
        if self._participants.get(pool) is participant:
            del self._participants[pool]

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("SharedCounters already started")
        self._client = async_client(
            self._redis_url, name="switchyard-fairness", timeout_s=self._timeout_s
        )
        self._task = asyncio.create_task(self._run(), name="fairness-sync")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)  # redis-py can swallow a cancellation mid-read
        await self.sync_once(force=True)
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()  # type: ignore[attr-defined]

    def _active(self) -> bool:
        """Whether the task keeps its fast beat: a charge since its last wake-up, or some
        queue contended now."""
        return self._charged or any(p.contended() for p in self._participants.values())

    async def _doze(self) -> None:
        """Sleep until the slow beat is due (at least ``interval_s``) or a charge comes in."""
        if self._participants or self._pending:
            due = self._last_push + self._idle_interval_s - self._clock()
        else:  # nothing to push or read: no slow beat is due either
            due = self._idle_interval_s
        wake = self._wake = asyncio.Event()
        try:
            with contextlib.suppress(TimeoutError):  # asyncio.timeout: no task per wait
                async with asyncio.timeout(max(self._interval_s, due)):
                    await wake.wait()
        finally:
            self._wake = None

    async def _run(self) -> None:
        while True:
            if self._active():
                self._charged = False
                await asyncio.sleep(self._interval_s)
            else:
                await self._doze()
                if self._charged:
                    continue  # woken by a charge: the fast beat from here
            self.wakeups += 1
            try:
                await self.sync_once()
            except Exception:
                logger.exception("fairness sync failed unexpectedly")
            raise_if_cancelling()  # a cancellation redis-py turned into an error ends the loop

    async def sync_once(self, *, force: bool = False) -> bool:
        """One round trip if anything is due; True when one was made and succeeded."""
        if self._client is None:
            return False
        contended = [p for p, part in self._participants.items() if part.contended()]
        push_due = self._clock() - self._last_push >= self._idle_interval_s
        if not contended and not ((self._pending or self._participants) and (push_due or force)):
            return False
        if push_due or force:
            contended = list(self._participants)  # read every pool on the slow beat
        batch, self._pending = self._pending, {}
        pipe = self._client.pipeline(transaction=False)
        for (pool, band, tenant), delta in batch.items():
            pipe.hincrbyfloat(self.key(pool), f"{band}|{tenant}", delta)
        for pool in {pool for pool, _, _ in batch}:
            pipe.expire(self.key(pool), self._ttl_s)
        for pool in contended:
            pipe.hgetall(self.key(pool))
        try:
            results = await pipe.execute()
        except (RedisError, OSError) as exc:
            for key, delta in batch.items():
                self._pending[key] = self._pending.get(key, 0.0) + delta
            if not self._failing:
                self._failing = True
                logger.warning("fairness: Redis unreachable (%r); counters stay local", exc)
            return False
        if self._failing:
            self._failing = False
            logger.warning("fairness: Redis answers again; counters are shared once more")
        self.syncs += 1
        self._last_push = self._clock()
        for pool, counters in zip(contended, results[len(results) - len(contended) :], strict=True):
            self._merge(pool, counters)
        return True

    def _merge(self, pool: str, counters: dict[bytes, bytes]) -> None:
        participant = self._participants.get(pool)
        if participant is None:
            return
        for field, raw in counters.items():
            band_text, _, tenant = field.decode("utf-8", "replace").partition("|")
            try:
                band, value = int(band_text), float(raw)
            except ValueError:
                continue
            participant.lift(band, tenant, value + self._pending.get((pool, band, tenant), 0.0))
