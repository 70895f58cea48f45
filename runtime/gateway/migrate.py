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
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Awaitable, Callable

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
from runtime.telemetry.resume_metrics import ResumeMetrics
from runtime.upstream.errors import StreamBroken, UpstreamError, UpstreamHTTPError
from runtime.upstream.response import Batch, UpstreamResponse, batches_of

# Opens ``body`` on an endpoint not in the set; raises UpstreamError when none answers.
Opener = Callable[[bytes, frozenset[int]], Awaitable[UpstreamResponse]]
# The model's token count of a text (None: no tokenizer): the tokens so far when a loaded
# engine merged several into one chunk (exact when the tokenization round-trips).
Counter = Callable[[str], Awaitable[int | None]]
CAUSE = "migration"


class _LengthEnd(Exception):  # noqa: N818 - control flow inside this module
    """The generation cannot go on: end it with ``finish_reason: "length"``."""


class MigratingStream:
    """The relay's view of an upstream stream that may move to another endpoint."""

    __slots__ = ("_body", "_count", "_current", "_kind", "_limit", "_metrics", "_open",
                 "_prompt_tokens", "migrations")  # fmt: skip

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
        broke_at = 0.0
        try:
            while True:
                source = (
                    batches_of(self._current) if seam is None else self._continued(seam, broke_at)
                )
                try:
                    async with contextlib.aclosing(source) as batches:
                        async for batch in batches:
                            relayed += batch[1]  # the bytes in hand: decoded only on a break
                            yield batch
                except StreamBroken as broken:
                    failed.add(self._current.endpoint_id)
                    broke_at = time.perf_counter()
                    try:
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

    async def _continued(self, seam: Seam, broke_at: float) -> AsyncGenerator[Batch, None]:
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
                    self._metrics.resumed(cause=CAUSE, reprefilled=seam.progress.tokens,
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
        try:
            document = decode_document(self._body)
            check_resumable(self._kind, document)
            progress = progress_of(self._kind, relayed)
        except NotResumable:
            self._metrics.outcome(cause=CAUSE, reason=reason, outcome="not_resumable")
            raise broken from None
        if self._count is not None:  # chunks are at most the tokens (merged deltas)
            counted = await self._count(progress.text)
            progress.tokens = max(progress.tokens, counted or 0)
        body = continuation(self._kind, document, progress)
        if body is None:
            self._metrics.outcome(cause=CAUSE, reason=reason, outcome="length")
            raise _LengthEnd(progress)
        try:
            upstream = await self._open(encode_document(body), frozenset(failed))
        except UpstreamHTTPError as exc:
            if exc.status == 400 and context_exceeded(exc.body):
                self._metrics.outcome(cause=CAUSE, reason=reason, outcome="length")
                raise _LengthEnd(progress) from None
            self._metrics.outcome(cause=CAUSE, reason=reason, outcome="failed")
            raise broken from exc
        except UpstreamError as exc:
            self._metrics.outcome(cause=CAUSE, reason=reason, outcome="failed")
            raise broken from exc
        await self._current.aclose()
        self._current = upstream
        self.migrations += 1
        self._metrics.outcome(cause=CAUSE, reason=reason, outcome="resumed")
        return progress

    async def aclose(self) -> None:
        await self._current.aclose()
