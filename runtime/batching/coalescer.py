"""Router-side coalescing of unary requests (docs/design.md).

Requests that the scheduler has already admitted and granted (fairness, limits and the
endpoint's in-flight slot are per request, before this) and that are compatible — same key:
version, endpoint, path — are gathered for at most ``window_s`` (or until ``max_batch`` of them,
or until the earliest deadline among them minus ``margin_s``) and sent upstream as one call. The
answer carries one ``(status, body)`` per request, so each gets its own usage and its own
error: one bad request does not fail its neighbours. A transport failure of the shared call
fails every member with that error (they shared the connection, not the verdict of their inputs).

The upstream call is injected (:data:`SendBatch`); the clock is the event loop's. No I/O here.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec


@dataclass(frozen=True, slots=True)
class Member:
    """One request in a coalesced call: its body, absolute deadline (loop time) and the class's
    latency SLO in seconds (the worker's batcher releases its input within it), if any."""

    body: bytes
    deadline: float
    slo_s: float | None = None


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: bytes


SendBatch = Callable[[Hashable, Sequence[Member]], Awaitable[Sequence[Reply]]]
"""One upstream call for a group: ``(key, members) -> one Reply per member, in order``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CoalescePolicy:
    window_s: float = 0.002
    max_batch: int = 64
    margin_s: float = 0.005

    @property
    def enabled(self) -> bool:
        return self.window_s > 0 and self.max_batch > 1


@dataclass(slots=True)
class _Group:
    members: list[Member] = field(default_factory=list)
    futures: list[asyncio.Future[Reply]] = field(default_factory=list)
    timer: asyncio.TimerHandle | None = None


class Coalescer:
    """Gathers members per key and flushes each group as one :data:`SendBatch` call."""

    def __init__(self, send: SendBatch, policy: CoalescePolicy | None = None) -> None:
        self._send = send
        self.policy = policy or CoalescePolicy()
        self._groups: dict[Hashable, _Group] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0  # upstream calls made (for tests and metrics)

    async def submit(self, key: Hashable, member: Member) -> Reply:
        """Join (or open) the group of ``key`` and wait for this member's reply."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Reply] = loop.create_future()
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group()
        group.members.append(member)
        group.futures.append(future)
        policy = self.policy
        if len(group.members) >= policy.max_batch:
            self._flush(key)
        else:
            due = min(
                loop.time() + policy.window_s,
                min(m.deadline for m in group.members) - policy.margin_s,
            )
            if group.timer is None or due < group.timer.when():
                if group.timer is not None:
                    group.timer.cancel()
                group.timer = loop.call_at(due, self._flush, key)
        return await future  # cancelling it leaves the call to finish for the others

    def _flush(self, key: Hashable) -> None:
        group = self._groups.pop(key, None)
        if group is None:
            return
        if group.timer is not None:
            group.timer.cancel()
        task = asyncio.get_running_loop().create_task(self._call(key, group))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _call(self, key: Hashable, group: _Group) -> None:
        self.calls += 1
        try:
            replies = await self._send(key, list(group.members))
        except Exception as exc:
            for future in group.futures:
                if not future.done():
                    future.set_exception(exc)
            return
        if len(replies) != len(group.members):
            error = RuntimeError(f"the upstream answered {len(replies)} of {len(group.members)}")
            for future in group.futures:
                if not future.done():
                    future.set_exception(error)
            return
        for future, reply in zip(group.futures, replies, strict=True):
            if not future.done():
                future.set_result(reply)

    async def close(self) -> None:
        """Flush what is waiting and wait for the calls in flight."""
        for key in list(self._groups):
            self._flush(key)
        tasks = list(self._tasks)
        for task in tasks:
            with contextlib.suppress(Exception):
                await task


def split_batch_reply(payload: Any, count: int) -> list[Reply]:
    """Decode the worker's ``{"responses": [{"status", "body"}...]}`` into ``count`` replies."""
    responses = payload.get("responses") if isinstance(payload, dict) else None
    if not isinstance(responses, list) or len(responses) != count:
        raise ValueError("the worker's batch answer does not have one response per request")
    replies: list[Reply] = []
    for item in responses:
        if not isinstance(item, dict) or not isinstance(item.get("status"), int):
            raise ValueError("a response of the worker's batch answer has no status")  # noqa: TRY004
        replies.append(Reply(status=item["status"], body=msgspec.json.encode(item.get("body"))))
    return replies
