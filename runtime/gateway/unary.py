"""Coalesced dispatch for unary routes served by the PyTorch worker (embeddings, classifications).

When the planned version runs on the ``torch`` runtime and coalescing is on, the request —
already admitted, scheduled and granted an endpoint slot like any other — joins the router's
:class:`~runtime.batching.coalescer.Coalescer` under ``(endpoint, version, path)``; the group goes
to the worker's ``/switchyard/v1/batch`` as one call and this request gets back its own
``(status, body)``: its own usage, its own error. Anything else takes the normal path (the
``dispatch`` stage asks :func:`coalescible`).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, ClassVar, cast

import msgspec

from runtime.batching.coalescer import CoalescePolicy, Coalescer, Member, Reply, split_batch_reply
from runtime.gateway.errors import ApiError, upstream_refusal
from runtime.gateway.plan import Plan
from runtime.gateway.relay import Usage
from runtime.gateway.upstream_errors import dispatch_error
from runtime.scheduling.grant import Grant
from runtime.snapshot import EndpointSnap
from runtime.upstream.client import UpstreamClient
from runtime.upstream.errors import UpstreamError

if TYPE_CHECKING:
    from runtime.gateway.bundles import UpstreamDeps
    from runtime.gateway.pipeline.context import RequestContext

BATCH_PATH = "/switchyard/v1/batch"
DEADLINE_HEADER = "X-Switchyard-Deadline-Ms"
TORCH_RUNTIME = "torch"


class _UsageOnly(msgspec.Struct):
    usage: Usage | None = None


def make_coalescer(client: UpstreamClient, window_s: float) -> Coalescer:
    """The router's coalescer (it starts nothing until a torch request arrives)."""

    async def send(key: Hashable, members: Sequence[Member]) -> Sequence[Reply]:
        endpoint, _version, path = cast("tuple[EndpointSnap, int, str]", key)
        return await send_batch(client, endpoint, path, members)

    return Coalescer(send, CoalescePolicy(window_s=window_s))


async def send_batch(
    client: UpstreamClient, endpoint: EndpointSnap, path: str, members: Sequence[Member]
) -> list[Reply]:
    """One ``/switchyard/v1/batch`` call carrying every member's body unchanged."""
    deadline = min(m.deadline for m in members)
    left_ms = max(0.0, (deadline - asyncio.get_running_loop().time()) * 1000)
    route = msgspec.json.encode(path)

    def item(member: Member) -> bytes:
        slo = b"" if member.slo_s is None else b',"slo_ms":%d' % round(member.slo_s * 1000)
        return b'{"path":' + route + slo + b',"body":' + member.body + b"}"

    body = b'{"requests":[' + b",".join(item(m) for m in members) + b"]}"
    upstream = await client.open_stream(
        endpoint,
        BATCH_PATH,
        body,
        deadline=deadline,
        headers={DEADLINE_HEADER: f"{left_ms:.0f}"},
        first_byte_cap=math.inf,
    )
    try:
        payload = msgspec.json.decode(await upstream.read_json())
    finally:
        await upstream.aclose()
    return split_batch_reply(payload, len(members))


class CoalescedDispatch:
    """Mixin marking an inference route whose torch-served requests are coalesced."""

    coalesced: ClassVar[bool] = True


def coalescible(deps: UpstreamDeps, plan: Plan, grant: Grant) -> bool:
    """Whether this granted request goes to the coalescer."""
    return (
        plan.version.runtime == TORCH_RUNTIME
        and grant.endpoint is not None
        and deps.coalesce_window_s > 0
    )


async def dispatch_coalesced(deps: UpstreamDeps, ctx: RequestContext) -> None:
    """Submit the request to the coalescer and answer the client with its own reply."""
    plan, attempts, record, labels = ctx.ready_plan, ctx.ready_attempts, ctx.record, ctx.labels
    grant = attempts.grant
    endpoint = grant.endpoint
    assert endpoint is not None  # coalescible() checked
    dispatched_at = time.perf_counter()
    attempts.count = 1
    record.attempts = 1
    try:
        reply = await deps.coalescer.submit(
            (endpoint, plan.version.id, ctx.spec.upstream_path),
            Member(
                body=plan.body,
                deadline=plan.deadline,
                slo_s=plan.klass.ttft_slo_ms / 1000 if plan.klass is not None else None,
            ),
        )
    except UpstreamError as exc:
        raise dispatch_error(exc, model=plan.model.name) from None
    except ValueError as exc:
        raise ApiError.of("upstream_error", reason=str(exc)) from None
    attempts.opened = True
    record.endpoint = labels.endpoint = str(endpoint.id)
    elapsed = time.perf_counter() - dispatched_at
    deps.metrics.observe("queue", grant.waited_s, labels)  # unary: no upstream_ttft (#33)
    record.timing("queue", grant.waited_s)
    record.timing("upstream_ttft", elapsed)
    if reply.status != 200:
        if reply.status < 500:
            raise upstream_refusal(reply.status, reply.body)
        raise ApiError.of("upstream_error", reason=f"it answered HTTP {reply.status}.")
    usage = msgspec.json.decode(reply.body, type=_UsageOnly).usage
    record.status = 200
    record.outcome = "ok"
    if usage is not None:
        record.prompt_tokens = usage.prompt_tokens
        record.completion_tokens = usage.completion_tokens
    ctx.usage = usage  # before the last chunk: settling (early) bills it
    headers = [
        (b"content-type", b"application/json"),
        (b"x-switchyard-version", plan.version.label.encode("latin-1")),
    ]
    await ctx.sink.start_response(200, headers)
    await ctx.sink.send_chunk(reply.body, last=True)
