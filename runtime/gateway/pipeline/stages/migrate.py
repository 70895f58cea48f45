"""Stage ``migrate``: a streamed generation keeps going on another endpoint when its engine
dies or its stream breaks (:mod:`runtime.gateway.migrate`). Per request it only wraps the
upstream response the relay reads (nothing decoded, nothing per chunk but a list append);
the continuation is built and opened only after a break, through the grant's ``reassign``
(the broken endpoints excluded) and the same retries before the first byte as dispatch.
Off when ``SWITCHYARD_STREAM_MIGRATIONS`` is 0 (unless the pool takes lent slots back by
preemption: then a stream that can be continued offers itself to its grant), for unary
answers and coalesced calls."""

from __future__ import annotations

import asyncio
import contextlib

import msgspec

from runtime.gateway.bundles import UpstreamDeps
from runtime.gateway.migrate import MigratingStream
from runtime.gateway.pipeline.context import Attempts, RequestContext
from runtime.gateway.plan import Plan
from runtime.gateway.resume import NotResumable, decode_document
from runtime.gateway.tokens import TokenCounter
from runtime.snapshot import EndpointSnap, VersionSnap
from runtime.upstream.dispatch import open_with_retry
from runtime.upstream.response import UpstreamResponse


class Migrate:
    name = "migrate"

    def __init__(self, deps: UpstreamDeps) -> None:
        self._deps = deps

    async def __call__(self, ctx: RequestContext) -> None:
        deps, upstream = self._deps, ctx.upstream
        if deps.resume_metrics is None or upstream is None or not upstream.is_stream:
            return
        plan, attempts = ctx.ready_plan, ctx.ready_attempts
        takes_back = attempts.grant.takes_back
        if not plan.streaming or (deps.stream_migrations < 1 and not takes_back):
            return
        headers = {"X-Request-Id": ctx.request_id, **deps.tracing.upstream_headers(ctx.record)}
        count = _TokenCount(deps.tokens, plan.version)
        stream = MigratingStream(
            upstream, kind=ctx.spec.kind, body=plan.body,
            open_next=_OpenNext(ctx, attempts, deps, plan, headers),
            limit=deps.stream_migrations, metrics=deps.resume_metrics,
            prompt_tokens=plan.prompt_tokens, count_tokens=count,
        )  # fmt: skip
        if takes_back:  # the request is decoded here only in a pool that preempts
            with contextlib.suppress(msgspec.DecodeError, NotResumable):
                stream.preemptible_by(attempts.grant, decode_document(plan.body))
        ctx.events = stream
        ctx.hold_async(stream.aclose)


# The two callbacks a stream keeps for a break are slotted objects, not closures: they live
# as long as the stream, and a closure is a function, a tuple and a cell per variable for
# the collector to walk (issue #27).


class _OpenNext:
    """Open the continuation on an endpoint that did not break (the stream's ``open_next``)."""

    __slots__ = ("_attempts", "_ctx", "_deps", "_headers", "_plan")

    def __init__(
        self, ctx: RequestContext, attempts: Attempts, deps: UpstreamDeps, plan: Plan,
        headers: dict[str, str],
    ) -> None:  # fmt: skip
        self._ctx = ctx
        self._attempts = attempts
        self._deps = deps
        self._plan = plan
        self._headers = headers

    async def __call__(self, body: bytes, broken: frozenset[int]) -> UpstreamResponse:
        ctx, deps, plan = self._ctx, self._deps, self._plan
        endpoint, response = await open_with_retry(
            _Elsewhere(self._attempts, broken), deps.client, deps.breakers,
            ctx.spec.upstream_path, body, deadline=plan.deadline, rng=deps.rng,
            max_attempts=deps.retry_attempts, backoff_base=deps.backoff_base_s,
            backoff_cap=deps.backoff_cap_s, headers=self._headers,
        )  # fmt: skip
        ctx.record.endpoint = str(endpoint.id)
        return response


class _TokenCount:
    """The model's token count of a text (None: no tokenizer), off the event loop."""

    __slots__ = ("_tokens", "_version")

    def __init__(self, tokens: TokenCounter | None, version: VersionSnap) -> None:
        self._tokens = tokens
        self._version = version

    async def __call__(self, text: str) -> int | None:
        tokens = self._tokens
        tokenizer = await tokens.tokenizer(self._version) if tokens is not None else None
        if tokenizer is None:
            return None
        encoding = await asyncio.to_thread(tokenizer.encode, text, add_special_tokens=False)
        return len(encoding.ids)


class _Elsewhere:
    """The pick for a continuation: another endpoint through the grant (which moves its
    in-flight slot along), never one whose stream broke."""

    __slots__ = ("_attempts", "_broken")

    def __init__(self, attempts: Attempts, broken: frozenset[int]) -> None:
        self._attempts = attempts
        self._broken = broken

    def __call__(self, exclude: frozenset[int]) -> EndpointSnap | None:
        self._attempts.count += 1
        grant = self._attempts.grant
        here = grant.endpoint  # after a preemption: the endpoint the queue gave it
        if here is not None and here.id not in exclude | self._broken:
            return here
        return grant.reassign(exclude | self._broken)
