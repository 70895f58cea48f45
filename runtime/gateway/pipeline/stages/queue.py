"""Stage ``queue``: wait in the pool's queue for an endpoint with room
(:func:`runtime.gateway.admit.acquire_slot`); registers the grant's release (early: the
endpoint slot is free when the client sees its response end).

A streaming request whose class has heartbeats on (``heartbeat_ms`` > 0) and that has to
wait gets its response headers when it is queued and ``: queued`` comments while it waits
(:mod:`runtime.gateway.heartbeat`); from then on the stages answer through that stream, and
a failure ends it with the terminal error chunk and ``[DONE]`` instead of an HTTP status."""

from __future__ import annotations

from collections.abc import Callable

from runtime.gateway.admit import acquire_slot
from runtime.gateway.bundles import AdmissionDeps
from runtime.gateway.heartbeat import DEFAULT_INTERVAL_MS, QueuedStream
from runtime.gateway.pipeline.context import Attempts, RequestContext
from runtime.gateway.plan import Plan
from runtime.gateway.relay import SSE_HEADERS


def heartbeat_ms(plan: Plan) -> int:
    """The heartbeat interval of ``plan``'s class (0: off); unary requests get none."""
    if not plan.streaming:
        return 0
    return plan.klass.heartbeat_ms if plan.klass is not None else DEFAULT_INTERVAL_MS


class _Beats:
    """The heartbeat stream of one request, made only when the dispatcher queues it: a
    request that goes straight to an endpoint (the common case) builds none, and its chunks
    pass through one sink fewer."""

    __slots__ = ("ctx", "interval_s", "stream")

    def __init__(self, ctx: RequestContext, interval_s: float) -> None:
        self.ctx = ctx
        self.interval_s = interval_s
        self.stream: QueuedStream | None = None

    def queued(self, position: Callable[[], int | None]) -> None:
        """``Ticket.on_queued``: from here on the stages answer through the stream."""
        ctx = self.ctx
        if self.stream is None:
            plan = ctx.ready_plan
            headers = [*SSE_HEADERS, *ctx.version_header()]
            stream = self.stream = QueuedStream(ctx.sink, interval_s=self.interval_s,
                                                headers=headers, kind=ctx.spec.kind,
                                                model=plan.model.name)  # fmt: skip
            ctx.sink = stream
            ctx.on_failure(lambda error: stream.fail(error, ctx.cut()))
        self.stream.queued(position)


class Queue:
    name = "queue"

    def __init__(self, deps: AdmissionDeps) -> None:
        self._deps = deps

    async def __call__(self, ctx: RequestContext) -> None:
        plan = ctx.ready_plan
        beats: _Beats | None = None
        if interval_ms := heartbeat_ms(plan):
            beats = _Beats(ctx, interval_ms / 1000.0)
        grant = await acquire_slot(self._deps, ctx.ready_snapshot, ctx.ready_principal.tenant,
                                   plan, ctx.ready_admission,
                                   on_queued=beats.queued if beats else None)  # fmt: skip
        ctx.grant = grant
        ctx.attempts = Attempts(grant)
        ctx.hold("grant", grant.release, early=True)  # before any await: never lost
        if beats is not None and beats.stream is not None:
            await beats.stream.stop()
