"""Stream migration: a stream whose engine dies or breaks mid-generation goes on elsewhere.

:class:`MigratingStream` stands in for the upstream response the relay reads
(:func:`runtime.gateway.relay.relay_stream` iterates its :meth:`~MigratingStream.events`).
While the stream is healthy it passes each payload through and keeps it (a list append of
the bytes in hand: nothing decoded). When the upstream breaks (any :class:`StreamBroken`
but the deadline's) it decodes what was relayed (:mod:`runtime.gateway.resume`), opens the
continuation on another endpoint through ``open_next`` (the grant's ``reassign``, excluding
every endpoint that broke, retried before its first byte like any dispatch, within the
request's deadline) and relays the continuation's chunks as the same stream. It does so at
most ``limit`` times; when it cannot (the limit, a request that cannot be continued, no
endpoint within the deadline) the original :class:`StreamBroken` propagates and the relay
ends the stream with today's terminal error event. A generation with no output budget or
context left ends with ``finish_reason: "length"`` instead.

**Preemption** (a pool with a ``preemption`` policy, :mod:`runtime.scheduling.takeback`):
the stream offers itself to its grant (:meth:`MigratingStream.preemptible_by`, when its
request can be continued). The dispatcher stops it by :meth:`~MigratingStream.preempt`:
the upstream response is closed from outside (its breaker not told: not the endpoint's
fault), so the relay's read breaks, and this stream, seeing its own flag, waits for the
grant to get a slot again (:meth:`~runtime.scheduling.grant.Grant.resumed`, parked in the
queue with its place and deadline) and opens the continuation on the endpoint it got, by the
same mechanism (cause ``preemption``, reason ``lent_slot``). The client sees a pause. While
it waits: the client going away cancels the wait (outcome ``cancelled``); its deadline
passing ends the stream with the ``deadline_exceeded`` terminal event (``deadline``);
no output budget or context left ends it with ``finish_reason: "length"`` (``length``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import Any

from runtime.gateway.resume import (
    NotResumable,
    Progress,
    Seam,
    check_resumable,
    context_exceeded,
    continuation,
    decode_document,
    encode_document,
    length_end,
    progress_of,
)
from runtime.scheduling.grant import Grant, NoEndpointError, QueueDropError
from runtime.scheduling.interfaces import DropReason
from runtime.telemetry.resume_metrics import ResumeMetrics
from runtime.upstream.errors import StreamBroken, UpstreamError, UpstreamHTTPError
from runtime.upstream.response import Batch, UpstreamResponse, batches_of

# Opens ``body`` on an endpoint not in the set; raises UpstreamError when none answers.
Opener = Callable[[bytes, frozenset[int]], Awaitable[UpstreamResponse]]
# The model's token count of a text (None: no tokenizer): the tokens so far when a loaded
# engine merged several into one chunk (exact when the tokenization round-trips).
Counter = Callable[[str], Awaitable[int | None]]
CAUSE = "migration"
PREEMPTION = "preemption"
LENT_SLOT = "lent_slot"  # the reason of a preemption: a lent slot taken back


class _LengthEnd(Exception):  # noqa: N818 - control flow inside this module
    """The generation cannot go on: end it with ``finish_reason: "length"``."""


class MigratingStream:
    """The relay's view of an upstream stream that may move to another endpoint."""

    __slots__ = ("_body", "_count", "_current", "_grant", "_kind", "_limit", "_metrics",
                 "_open", "_preempted_at", "_prompt_tokens", "_streaming", "migrations",
                 "preemptions")  # fmt: skip

    def __init__(
        self,
        first: UpstreamResponse,
        *,
        kind: str,
        body: bytes,
        open_next: Opener,
        limit: int,
        metrics: ResumeMetrics,
        prompt_tokens: int = 0,
        count_tokens: Counter | None = None,
    ) -> None:
        self._current = first
        self._kind = kind
        self._body = body
        self._open = open_next
        self._limit = limit
        self._metrics = metrics
        self._prompt_tokens = prompt_tokens  # planning's count: the usage of a length end
        self._count = count_tokens
        self.migrations = 0
        self.preemptions = 0
        self._grant: Grant | None = None
        self._streaming = False  # relaying the current upstream's events
        self._preempted_at: float | None = None

    def preemptible_by(self, grant: Grant, document: dict[str, Any]) -> None:
        """Offer this stream to ``grant``'s pool for preemption when ``document`` (the
        request) can be continued (:func:`runtime.gateway.resume.check_resumable`)."""
        try:
            check_resumable(self._kind, document)
        except NotResumable:
            return
        self._grant = grant
        grant.preemptible(self)

    def preemptible(self) -> bool:
        """Streaming from a live upstream, not ending, not moving, not already stopped."""
        return self._streaming and self._preempted_at is None and not self._current.done

    def preempt(self) -> None:
        """Stop the upstream now (the dispatcher took the slot back); the relay's read breaks
        and :meth:`events` resumes the stream when the grant gets a slot again."""
        self._preempted_at = time.perf_counter()
        self._metrics.preempted(reason=LENT_SLOT)
        self._current.set_broken_listener(None)  # not the endpoint's fault: no breaker
        self._current.close()

    async def events(self) -> AsyncGenerator[bytes, None]:
        """Each payload of the stream, across migrations, as the client's one stream."""
        async with contextlib.aclosing(self.batches()) as batches:
            async for _raw, payloads in batches:
                for payload in payloads:
                    yield payload

    async def batches(self) -> AsyncGenerator[Batch, None]:
        """:meth:`events` by the chunk read (:meth:`UpstreamResponse.batches`): the engine's
        own bytes come along while the first upstream streams (a continuation's payloads
        are rewritten, so they come one by one without them)."""
        relayed: list[bytes] = []
        failed: set[int] = set()
        seam: Seam | None = None
        broke_at, cause = 0.0, CAUSE
        try:
            while True:
                source = (batches_of(self._current) if seam is None
                          else self._continued(seam, broke_at, cause))  # fmt: skip
                try:
                    self._streaming = True
                    async with contextlib.aclosing(source) as batches:
                        async for batch in batches:
                            relayed += batch[1]  # the bytes in hand: decoded only on a break
                            yield batch
                except StreamBroken as broken:
                    self._streaming = False
                    preempted_at, self._preempted_at = self._preempted_at, None
                    try:
                        if preempted_at is not None:  # the dispatcher took the slot back
                            broke_at, cause = preempted_at, PREEMPTION
                            progress = await self._resume(broken, relayed, failed)
                        else:
                            failed.add(self._current.endpoint_id)
                            broke_at, cause = time.perf_counter(), CAUSE
                            progress = await self._move(broken, relayed, failed)
                    except _LengthEnd as end:
                        yield None, list(length_end(
                            self._kind, end.args[0], prompt_tokens=self._prompt_tokens
                        ))  # fmt: skip
                        return
                    seam = Seam(self._kind, progress)
                else:
                    return
        finally:
            await self._current.aclose()

    async def _continued(
        self, seam: Seam, broke_at: float, cause: str
    ) -> AsyncGenerator[Batch, None]:
        """The continuation's payloads as the client's stream carries them; the first one
        observes the pause since the break."""
        first = True
        async with contextlib.aclosing(self._current.events()) as events:
            async for payload in events:
                rewritten = seam.rewrite(payload)
                if rewritten is None:
                    continue
                if first:
                    first = False
                    self._metrics.resumed(cause=cause, reprefilled=seam.progress.tokens,
                                          seconds=time.perf_counter() - broke_at)  # fmt: skip
                yield None, [rewritten]

    async def _move(self, broken: StreamBroken, relayed: list[bytes], failed: set[int]) -> Progress:
        """Open the continuation after ``broken`` (the current upstream becomes it); raises
        ``broken`` itself when the stream cannot move, _LengthEnd when it is spent."""
        reason = broken.reason
        if reason == "deadline":
            raise broken
        if self.migrations >= self._limit:
            self._metrics.outcome(cause=CAUSE, reason=reason, outcome="limit")
            raise broken
        progress, body = await self._next_body(broken, relayed, CAUSE)
        await self._switch(broken, progress, body, failed, CAUSE)
        self.migrations += 1
        return progress

    async def _resume(
        self, broken: StreamBroken, relayed: list[bytes], failed: set[int]
    ) -> Progress:
        """After a preemption: wait (parked) for a slot again, then open the continuation on
        it; raises a StreamBroken (``deadline`` when the deadline passed while it waited),
        _LengthEnd when the generation is spent."""
        progress, body = await self._next_body(broken, relayed, PREEMPTION)
        grant = self._grant
        assert grant is not None  # preempt() comes only through the grant it was offered to
        try:
            await grant.resumed()
        except QueueDropError as exc:
            expired = exc.reason == DropReason.DEADLINE_EXPIRED
            self._metrics.outcome(cause=PREEMPTION, reason=LENT_SLOT,
                                  outcome="deadline" if expired else "failed")  # fmt: skip
            reason = "deadline" if expired else broken.reason
            raise StreamBroken(str(exc), reason=reason, endpoint_id=broken.endpoint_id) from None
        except NoEndpointError as exc:
            self._metrics.outcome(cause=PREEMPTION, reason=LENT_SLOT, outcome="failed")
            raise broken from exc
        except asyncio.CancelledError:
            self._metrics.outcome(cause=PREEMPTION, reason=LENT_SLOT, outcome="cancelled")
            raise
        await self._switch(broken, progress, body, failed, PREEMPTION)
        self.preemptions += 1
        if grant.takes_back:
            grant.preemptible(self)  # (up to the take-back's limit per stream)
        return progress

    async def _next_body(
        self, broken: StreamBroken, relayed: list[bytes], cause: str
    ) -> tuple[Progress, bytes]:
        """What was relayed and the continuation's body; raises ``broken`` when the stream
        cannot be continued, _LengthEnd when its output budget is spent."""
        reason = LENT_SLOT if cause == PREEMPTION else broken.reason
        try:
            document = decode_document(self._body)
            check_resumable(self._kind, document)
            progress = progress_of(self._kind, relayed)
        except NotResumable:
            self._metrics.outcome(cause=cause, reason=reason, outcome="not_resumable")
            raise broken from None
        if self._count is not None:  # chunks are at most the tokens (merged deltas)
            counted = await self._count(progress.text)
            progress.tokens = max(progress.tokens, counted or 0)
        body = continuation(self._kind, document, progress)
        if body is None:
            self._metrics.outcome(cause=cause, reason=reason, outcome="length")
            raise _LengthEnd(progress)
        return progress, encode_document(body)

    async def _switch(
        self, broken: StreamBroken, progress: Progress, body: bytes, failed: set[int], cause: str
    ) -> None:
        """Open ``body`` (the continuation) and make it the current upstream; raises
        ``broken`` when no endpoint opens it, _LengthEnd when it is over the context."""
        reason = LENT_SLOT if cause == PREEMPTION else broken.reason
        try:
            upstream = await self._open(body, frozenset(failed))
        except UpstreamHTTPError as exc:
            if exc.status == 400 and context_exceeded(exc.body):
                self._metrics.outcome(cause=cause, reason=reason, outcome="length")
                raise _LengthEnd(progress) from None
            self._metrics.outcome(cause=cause, reason=reason, outcome="failed")
            raise broken from exc
        except UpstreamError as exc:
            self._metrics.outcome(cause=cause, reason=reason, outcome="failed")
            raise broken from exc
        await self._current.aclose()
        self._current = upstream
        self._metrics.outcome(cause=cause, reason=reason, outcome="resumed")

    async def aclose(self) -> None:
        await self._current.aclose()
