"""A batch kept in memory on the request path and written to Redis by a background timer.

The request path only updates the subclass's in-memory batch; :class:`PeriodicFlusher` owns
the rest: ``start`` opens a named Redis client and a task that calls ``flush`` every
``interval_s``, ``stop`` ends the task, flushes once more and closes the client. A subclass
implements ``flush`` (with ``self._client``, None until started) and keeps its batch for the
next round when the write fails. The timer is a plain ``asyncio.sleep``, the cheapest wake-up
(no timeout context, no exception per round: issue #27); ``stop`` cancels the task only while
it sleeps, never during a flush. Users: the API-key last-use recorder
(:mod:`runtime.gateway.key_usage`) and the per-version counters
(:mod:`runtime.telemetry.versions`).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runtime.redis_conn import async_client


class PeriodicFlusher(abc.ABC):
    """The timer and connection around a subclass's ``flush`` (see the module docstring)."""

    def __init__(self, redis_url: str, *, interval_s: float, name: str) -> None:
        if not interval_s > 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s!r}")
        self._redis_url = redis_url
        self._interval_s = interval_s
        self._name = name
        self._client: aioredis.Redis[bytes] | None = None
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self._sleeping = False  # the task is between two flushes (safe to cancel)

    @abc.abstractmethod
    async def flush(self) -> int:
        """Write the pending batch; returns how much was written (0 on failure or nothing)."""

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError(f"{type(self).__name__} already started")
        self._client = async_client(
            self._redis_url, name=self._name, timeout_s=5.0, connect_timeout_s=1.0
        )
        self._stopping = False
        self._task = asyncio.create_task(self._run(), name=f"{self._name}-flusher")

    async def stop(self) -> None:
        """Stop the timer, flush what is pending once more, close the connection."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            if self._sleeping:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.flush()
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()  # type: ignore[attr-defined]

    async def _run(self) -> None:
        while not self._stopping:
            self._sleeping = True
            try:
                await asyncio.sleep(self._interval_s)
            finally:
                self._sleeping = False
            await self.flush()
