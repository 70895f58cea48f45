"""One inference request's context: what the stages decided and what it holds.

The stages (:mod:`runtime.gateway.pipeline.stages`) fill a :class:`RequestContext` in order:
the principal, the plan, the cache job, the admission, the grant, the upstream attempts,
the relay's result. Whatever a stage acquires that must be given back (the limits'
admission, the pool grant, the cache job) it registers on the context, through
:meth:`RequestContext.hold` or :meth:`RequestContext.hold_async`, and nowhere else: the
context's exit stack runs each release exactly once, on every exit path (an error, a
cancellation, a client gone, a cache hit, an idempotent replay, the router's shutdown cut).

A release registered with ``early=True`` also runs when the response's last byte is about to
go out (:class:`EndGuard`, the sink every stage sends through): a client that sees its
response end has its concurrency slot back, so it may send its next request at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from runtime.cache.entry import Entry
from runtime.gateway.admit import Admission
from runtime.gateway.auth import Principal
from runtime.gateway.cache_front import CacheJob
from runtime.gateway.plan import Plan
from runtime.gateway.relay import RelayResult, ResponseSink, Usage
from runtime.gateway.schema import Decoded, RequestDecoder
from runtime.gateway.screen import OutputScreen
from runtime.safety.compiled import CompiledPack
from runtime.scheduling.grant import Grant
from runtime.snapshot import EndpointSnap, Snapshot
from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.metrics import StageLabels
from runtime.upstream.response import EventSource, UpstreamResponse

Headers = Iterable[tuple[bytes, bytes]]
END_WAIT_S = 0.25  # the most the last chunk waits for the early releases' writes (Redis)


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteSpec:
    """What one inference route is: its path, kind, upstream path, tasks and decoder."""

    route: str
    kind: str  # "chat" | "completion" | "embedding" | "classification"
    upstream_path: str
    tasks: frozenset[str]
    decoder: RequestDecoder[Any]
    coalesced: bool = False  # unary, served in batches by the torch worker when it can


class Release:
    """A callback that runs at most once, whoever calls it first (early or at exit).

    Called with no arguments early, or by the exit stack with the exit's exception details
    (ignored): it is pushed on the stack itself, with no wrapper closure of contextlib's per
    hold (objects that live as long as the request: the collector's work; issue #27)."""

    __slots__ = ("_callback", "done", "name")

    def __init__(self, name: str, callback: Callable[[], None]) -> None:
        self.name = name
        self._callback = callback
        self.done = False

    def __call__(self, *_exit: object) -> None:
        if self.done:
            return
        self.done = True
        self._callback()


class _AsyncRelease:
    """``release`` awaited at the exit, as ``push_async_callback`` would (its result ignored:
    it never suppresses the exception), without contextlib's wrapper closure."""

    __slots__ = ("_release",)

    def __init__(self, release: Callable[[], Awaitable[None]]) -> None:
        self._release = release

    async def __call__(self, *_exit: object) -> None:
        await self._release()


class _OnFailure:
    """``handler(error)`` awaited when the exit has an exception; it still propagates."""

    __slots__ = ("_handler",)

    def __init__(self, handler: Callable[[BaseException], Awaitable[None]]) -> None:
        self._handler = handler

    async def __call__(self, _type: object, error: BaseException | None, _tb: object) -> bool:
        if error is not None:
            await self._handler(error)
        return False


class Attempts:
    """The pick callback for ``open_with_retry``: the granted endpoint first (the dispatcher
    already holds its in-flight slot), then, on a retry, another endpoint with room (else the
    routing choice) through :meth:`Grant.reassign`, which moves the slot along."""

    __slots__ = ("count", "grant", "opened")

    def __init__(self, grant: Grant) -> None:
        self.grant = grant
        self.count = 0
        self.opened = False  # the upstream answered (the request reached an engine)

    def __call__(self, exclude: frozenset[int]) -> EndpointSnap | None:
        granted = self.grant.endpoint
        if self.count == 0 and granted is not None and granted.id not in exclude:
            endpoint: EndpointSnap | None = granted
        else:
            endpoint = self.grant.reassign(exclude)
        if endpoint is not None:
            self.count += 1
        return endpoint


class MissingStepError(RuntimeError):
    """A stage ran before the one that provides what it reads (a wrong stage list)."""


@dataclass(slots=True, eq=False, kw_only=True)
class RequestContext:
    """One request on its way through the stages."""

    spec: RouteSpec
    request_id: str
    body: bytes
    headers: Callable[[bytes], bytes | None]  # the request's header by lower-case name
    raw_headers: Iterable[tuple[bytes, bytes]]
    client: ResponseSink  # the consumer: the response to the client
    cut: Callable[[], str | None]  # the reason the router cuts the request, else None
    record: RequestRecord
    labels: StageLabels = field(default_factory=StageLabels)
    exits: contextlib.AsyncExitStack = field(default_factory=contextlib.AsyncExitStack)
    snapshot: Snapshot | None = None
    principal: Principal | None = None
    batch_line: str = ""  # a batch line's ledger reference (the executor's signed mark)
    request: Decoded[Any] | None = None
    plan: Plan | None = None
    job: CacheJob | None = None
    admission: Admission | None = None
    hit: Entry | None = None  # the cache entry a hit was answered with
    grant: Grant | None = None
    attempts: Attempts | None = None
    upstream: UpstreamResponse | None = None
    events: EventSource | None = None  # what the relay reads instead (a migrating stream)
    relay: RelayResult | None = None  # the relay's result, filled while it runs
    usage: Usage | None = None  # the usage of an answer that completed
    packs: tuple[CompiledPack, ...] = ()  # the safety packs in force (the prefilter's find)
    screen: OutputScreen | None = None  # the post-filter's output check (stop rules in force)
    answered: bool = False  # a stage answered: the stages after it do not run
    detach: bool = False  # the rest runs to its end without the client (Idempotency-Key)
    # Headers a stage adds to any answer, whoever starts it (the rate limits, a degradation's).
    response_headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    sink: ResponseSink = field(init=False)
    _early: list[Callable[[], None]] = field(default_factory=list)
    _early_waits: list[Callable[[], Awaitable[None] | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.sink = EndGuard(self.client, self.release_early, self.response_headers)

    # -- what earlier stages decided (a missing one is a wrong stage order) ---------------
    # (each checks inline: ~36 reads per request, one call each, not two; issue #27)

    @property
    def ready_snapshot(self) -> Snapshot:
        value = self.snapshot
        if value is None:
            raise _missing("snapshot")
        return value

    @property
    def ready_principal(self) -> Principal:
        value = self.principal
        if value is None:
            raise _missing("principal")
        return value

    @property
    def ready_plan(self) -> Plan:
        value = self.plan
        if value is None:
            raise _missing("plan")
        return value

    @property
    def ready_job(self) -> CacheJob:
        value = self.job
        if value is None:
            raise _missing("cache job")
        return value

    @property
    def ready_admission(self) -> Admission:
        value = self.admission
        if value is None:
            raise _missing("admission")
        return value

    @property
    def ready_attempts(self) -> Attempts:
        value = self.attempts
        if value is None:
            raise _missing("attempts")
        return value

    def version_header(self) -> list[tuple[bytes, bytes]]:
        """``x-switchyard-version``: the version that serves the request."""
        return [(b"x-switchyard-version", self.ready_plan.version.label.encode("latin-1"))]

    # -- the one release mechanism ---------------------------------------------------------

    def hold(self, name: str, release: Callable[[], None], *, early: bool = False) -> Release:
        """Run ``release`` exactly once when the request ends (or, ``early``, when its
        response's last byte is about to go out, whichever comes first)."""
        once = Release(name, release)
        _push(self.exits, once, is_sync=True)
        if early:
            self._early.append(once)
        return once

    def hold_async(self, release: Callable[[], Awaitable[None]]) -> None:
        """Await ``release`` exactly once when the request ends."""
        _push(self.exits, _AsyncRelease(release), is_sync=False)

    def on_failure(self, handler: Callable[[BaseException], Awaitable[None]]) -> None:
        """Await ``handler(error)`` when the request ends by an exception (a refusal, a
        cancellation), at its place among the releases; the exception still propagates."""
        _push(self.exits, _OnFailure(handler), is_sync=False)

    def before_end(self, step: Callable[[], None]) -> None:
        """Run ``step`` only if the response ends cleanly (its last chunk goes out), before
        the early releases registered before it (e.g. the relay's final usage, which settling
        reads)."""
        self._early.append(step)

    def wait_before_end(self, written: Callable[[], Awaitable[None] | None]) -> None:
        """After the early releases, await what ``written()`` returns (None: nothing to wait
        for; bounded by :data:`END_WAIT_S`) before the last chunk goes out: e.g. the freed
        concurrency slot reaching Redis."""
        self._early_waits.append(written)

    async def release_early(self) -> None:
        """The response is about to end: run the early steps and releases, latest first, and
        wait for their writes. Not when the router cuts the request (its shutdown): the exit
        stack settles then."""
        if self.cut() is not None:
            return
        early, self._early = self._early, []
        for step in reversed(early):
            step()
        waits, self._early_waits = self._early_waits, []
        pending = [wait for wait in (written() for written in waits) if wait is not None]
        if pending:  # no timer at all for the common case, where nothing is in flight
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(END_WAIT_S):
                    for wait in pending:
                        await wait


class EndGuard:
    """The sink every stage answers through: before the response's last chunk goes out it
    runs the context's early releases (the concurrency slot, the grant, settling), so the
    client never sees its response end while its slot is still taken. The response carries
    ``extra`` headers too (the context's ``response_headers``: the rate limits, a degradation's)."""

    __slots__ = ("_before_end", "_extra", "_sink")

    def __init__(
        self, sink: ResponseSink, before_end: Callable[[], Awaitable[None]],
        extra: list[tuple[bytes, bytes]] | None = None,
    ) -> None:  # fmt: skip
        self._sink = sink
        self._before_end = before_end
        self._extra = [] if extra is None else extra

    async def start_response(self, status: int, headers: Headers) -> None:
        if self._extra:
            headers = [*headers, *self._extra]
        await self._sink.start_response(status, headers)

    def send_chunk(self, data: bytes, *, last: bool = False) -> Awaitable[None]:
        # A chunk that is not the last is the sink's own send: no coroutine of ours per chunk.
        if last:
            return self._send_last(data)
        return self._sink.send_chunk(data)

    async def _send_last(self, data: bytes) -> None:
        await self._before_end()
        await self._sink.send_chunk(data, last=True)


def _push(stack: contextlib.AsyncExitStack, exit_: Callable[..., Any], *, is_sync: bool) -> None:
    """Push ``exit_`` (called with the exit's exception details) as ``push`` and
    ``push_async_exit`` push a callable that is not a context manager, without their look-up
    of ``__exit__`` / ``__aexit__`` (an AttributeError raised and caught per push)."""
    stack._push_exit_callback(exit_, is_sync)  # type: ignore[attr-defined]  # CPython 3.7+


def _missing(what: str) -> MissingStepError:
    return MissingStepError(f"no {what} yet: a stage runs before the one that makes it")
