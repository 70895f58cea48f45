"""The inference routes: POST /v1/chat/completions, /v1/completions, /v1/embeddings.

One request: authenticate, parse, resolve model/class/deadline, pick the version, check the
token caps (:mod:`.plan`); the tenant's limits in Redis, then the pool queue until an
endpoint has room (:mod:`.admit`); open upstream on the granted endpoint (retrying elsewhere
before the first byte); relay, charging streamed output tokens to the tenant's fairness
counter; settle the limits with the actual usage. Every refusal happens before anything is
sent upstream. Per-stage timings go to Prometheus and to one JSON log line per request.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, ClassVar

from runtime.cache.entry import Entry
from runtime.cache.gateway import HIT_HEADER, CacheJob, cache_front, send_entry
from runtime.gateway.admit import (
    Admission,
    acquire_slot,
    admit_limits,
    charge_hit,
    settle_limits,
)
from runtime.gateway.auth import authenticate, bearer_token
from runtime.gateway.consumers import GatewayConsumer, header
from runtime.gateway.errors import ApiError
from runtime.gateway.plan import GENERATIVE, Plan, plan_request
from runtime.gateway.relay import RelayResult, ResponseSink, Usage, relay_stream, relay_unary
from runtime.gateway.schema import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    RequestDecoder,
    decode_request,
)
from runtime.gateway.state import RouterState
from runtime.gateway.unary import CoalescedDispatch
from runtime.gateway.upstream_errors import dispatch_error
from runtime.metering.events import UsageEvent
from runtime.scheduling.grant import Grant
from runtime.snapshot import EndpointSnap, Snapshot, TenantSnap
from runtime.telemetry.logging import RequestRecord, log_request
from runtime.telemetry.metrics import StageLabels
from runtime.upstream.dispatch import open_with_retry
from runtime.upstream.errors import UpstreamError
from runtime.upstream.response import UpstreamResponse


class _Attempts:
    """The pick callback for open_with_retry: the granted endpoint first (the dispatcher
    already holds its in-flight slot), then, on a retry, another endpoint with room (else
    the routing choice) through :meth:`Grant.reassign`, which moves the slot along."""

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


def _usage_outcome(outcome: str, usage: Usage | None) -> str:
    """The ledger's outcome: "ok" (answered with usage), "cancelled" (the client went away),
    else "error" (a broken stream, a deadline, an error after the engine was reached)."""
    if outcome in ("", "ok", "client_disconnected") and usage is None:
        return "cancelled"
    return "ok" if outcome in ("", "ok") else "error"


class InferenceConsumer(GatewayConsumer):
    methods: ClassVar[tuple[str, ...]] = ("POST",)
    route: ClassVar[str] = ""
    kind: ClassVar[str] = ""  # "chat" | "completion" | "embedding"
    upstream_path: ClassVar[str] = ""
    tasks: ClassVar[frozenset[str]] = GENERATIVE
    decoder: ClassVar[RequestDecoder[Any]]
    relay_sink: ResponseSink | None = None  # a capturing sink when the answer is cached

    async def respond(self, body: bytes) -> None:
        state = self.state
        record = RequestRecord(request_id=self.request_id, route=self.route)
        if state.tracing.enabled:
            state.tracing.begin(record, header(self.scope, b"traceparent"))
        labels = StageLabels()
        try:
            await self._serve(state, body, record, labels)
        except ApiError as exc:
            record.status, record.outcome = exc.status, exc.code or "error"
            raise
        except asyncio.CancelledError:
            if self.cut_reason is not None:  # the router's grace period ended
                record.status, record.outcome = record.status or 503, self.cut_reason
            else:
                record.status, record.outcome = record.status or 499, "client_disconnected"
            raise
        except Exception:
            record.status, record.outcome = record.status or 500, "internal_error"
            raise
        finally:
            self._account(state, record, labels)

    def on_refused(self, error: ApiError) -> None:
        record = RequestRecord(request_id=self.request_id, route=self.route)
        record.status, record.outcome = error.status, error.code or "error"
        self._account(self.state, record, StageLabels())

    @staticmethod
    def _account(state: RouterState, record: RequestRecord, labels: StageLabels) -> None:
        elapsed = time.monotonic() - record.started
        record.timing("e2e", elapsed)
        state.metrics.observe("e2e", elapsed, labels)
        auth_ms = record.timings_ms.get("auth")
        if auth_ms is not None:
            state.metrics.observe("auth", auth_ms / 1000.0, labels)
        state.metrics.count(
            model=labels.model, klass=labels.klass, outcome=record.outcome, tenant=record.tenant
        )
        state.metrics.observe_slis(record, state.snapshot)
        if state.scaling is not None:  # TTFT against the class SLO, for the autoscaler
            state.scaling.observe_request(record, state.snapshot)
        state.tracing.finish(record)
        if state.live is not None:
            state.live.record(record)
        log_request(state.request_log, record)
        state.version_stats.record_request(record)  # per-version telemetry for rollout gates

    async def _serve(
        self, state: RouterState, body: bytes, record: RequestRecord, labels: StageLabels
    ) -> None:
        snapshot = state.snapshot
        if snapshot is None:
            raise ApiError.of("not_ready")
        started = time.perf_counter()
        try:
            principal = authenticate(
                snapshot, bearer_token(header(self.scope, b"authorization")), now=time.time()
            )
        finally:
            record.timing("auth", time.perf_counter() - started)
        record.tenant, record.api_key = principal.tenant.slug, principal.key.prefix
        if 0 < principal.tenant.max_request_bytes < len(body):  # the tenant's own size cap
            raise self.too_large(principal.tenant.max_request_bytes)
        state.key_usage.record(principal.key.prefix, time.time())
        request = decode_request(body, self.decoder)
        plan = await plan_request(
            state,
            snapshot,
            principal=principal,
            request=request,
            route=self.route,
            tasks=self.tasks,
            class_header=header(self.scope, b"x-switchyard-class"),
            timeout_header=header(self.scope, b"x-request-timeout"),
            headers=self.scope.get("headers", ()),  # a rollout's sticky header
            record=record,
            labels=labels,
        )
        cache = cache_front(state)
        job = await cache.begin(
            route=self.route, document=request.document, model=plan.model,
            version=plan.version, tenant=principal.tenant,
            cache_control=header(self.scope, b"cache-control"),
            idempotency=header(self.scope, b"idempotency-key"), deadline=plan.deadline,
        )  # fmt: skip
        if job.replay is not None:  # an Idempotency-Key's stored answer: served, not billed
            await self._send_stored(job.replay, plan, record, b"idempotent-replay")
            return
        work = self._serve_planned(
            state, snapshot, principal.tenant, plan, job=job, record=record, labels=labels
        )
        if job.hold is None:
            await work
        else:  # the first request of an Idempotency-Key runs to its end without its client
            await asyncio.shield(asyncio.ensure_future(work))

    async def _serve_planned(
        self, state: RouterState, snapshot: Snapshot, tenant: TenantSnap, plan: Plan, *,
        job: CacheJob, record: RequestRecord, labels: StageLabels,
    ) -> None:  # fmt: skip
        cache = cache_front(state)
        usage: Usage | None = None
        try:
            admission = await admit_limits(state, snapshot, tenant, plan)
            state.shadow.offer(snapshot, plan.model, plan.version, self.upstream_path, plan.body)
            attempts: _Attempts | None = None
            hit: Entry | None = None
            try:
                hit = await cache.lookup(job, deadline=plan.deadline)
                if hit is not None:  # skips the pool queue; billed at the cache-hit price
                    await self._send_stored(hit, plan, record, b"hit")
                    usage = Usage(hit.usage.prompt_tokens, hit.usage.completion_tokens,
                                  hit.usage.total_tokens)  # fmt: skip
                    charge_hit(state, snapshot, tenant, plan, admission,
                               tokens_in=usage.prompt_tokens,
                               tokens_out=usage.completion_tokens)  # fmt: skip
                else:
                    grant = await acquire_slot(state, snapshot, tenant, plan, admission)
                    attempts = _Attempts(grant)
                    self.relay_sink = cache.sink_for(job, self)
                    try:
                        usage = await self._dispatch(state, plan, attempts, record, labels)
                    finally:
                        grant.release()
            finally:
                self._settle(state, admission, plan=plan, attempts=attempts, usage=usage,
                             record=record, cached=hit is not None)  # fmt: skip
        finally:
            await cache.finish(job, kind=self.kind, streaming=plan.streaming,
                               outcome=record.outcome, usage=usage)  # fmt: skip

    async def _send_stored(
        self, entry: Entry, plan: Plan, record: RequestRecord, how: bytes
    ) -> None:
        record.status, record.outcome = 200, "ok"
        record.prompt_tokens = entry.usage.prompt_tokens
        record.completion_tokens = entry.usage.completion_tokens
        headers = [(b"x-switchyard-version", plan.version.label.encode("latin-1")),
                   (HIT_HEADER, how)]  # fmt: skip
        await send_entry(self, entry, streaming=plan.streaming, include_usage=plan.include_usage,
                         headers=headers, cut=lambda: self.cut_reason)  # fmt: skip

    @staticmethod
    def _settle(
        state: RouterState,
        admission: Admission,
        *,
        plan: Plan,
        attempts: _Attempts | None,
        usage: Usage | None,
        record: RequestRecord,
        cached: bool = False,
    ) -> None:
        """Bill what reached an engine: the usage, else the prompt estimate and the tokens
        counted while streaming (a cancelled or broken stream); nothing otherwise. A cache
        hit is billed its stored usage at the cache-hit price."""
        opened = cached or (attempts is not None and attempts.opened)
        if usage is not None:
            tokens_in, tokens_out = usage.prompt_tokens, usage.completion_tokens
        else:
            tokens_in = plan.prompt_tokens if opened else 0
            tokens_out = attempts.grant.charged_output if attempts is not None else 0
        event = None
        if opened:
            timings = record.timings_ms
            event = UsageEvent(
                id=admission.lease.id, tenant=admission.lease.tenant, api_key=record.api_key,
                version=plan.version.id,
                endpoint=int(record.endpoint) if record.endpoint.isdigit() else None,
                tier=admission.tier, request_class=plan.klass.name if plan.klass else "default",
                tokens_in=tokens_in, tokens_out=tokens_out, cost_uc=0, cached=cached,
                outcome=_usage_outcome(record.outcome, usage),
                occurred_at=time.time(), queue_ms=timings.get("queue"),
                ttft_ms=timings.get("upstream_ttft"),
                total_ms=round((time.monotonic() - record.started) * 1000.0, 3),
                request_id=record.request_id,
            )  # fmt: skip
        settle_limits(state, admission, served=opened, tokens_in=tokens_in,
                      tokens_out=tokens_out, usage_known=usage is not None,
                      event=event, cached=cached)  # fmt: skip

    async def _dispatch(
        self,
        state: RouterState,
        plan: Plan,
        attempts: _Attempts,
        record: RequestRecord,
        labels: StageLabels,
    ) -> Usage | None:
        # Stage clocks use perf_counter: uvloop's loop.time() ticks in whole milliseconds.
        grant = attempts.grant
        dispatched_at = time.perf_counter()
        try:
            endpoint, upstream = await open_with_retry(
                attempts,
                state.client,
                state.breakers,
                self.upstream_path,
                plan.body,
                deadline=plan.deadline,
                rng=state.rng,
                max_attempts=state.config.retry_attempts,
                backoff_base=state.config.retry_backoff_base_s,
                backoff_cap=state.config.retry_backoff_cap_s,
                headers={"X-Request-Id": self.request_id, **state.tracing.upstream_headers(record)},
                first_byte_cap=None if plan.streaming else math.inf,
            )
        except UpstreamError as exc:
            raise dispatch_error(exc, model=plan.model.name) from None
        finally:
            record.attempts = attempts.count
            if attempts.count > 1:
                state.metrics.retries_total.labels(plan.model.name).inc(attempts.count - 1)
        attempts.opened = True
        record.endpoint = labels.endpoint = str(endpoint.id)
        ttft = time.perf_counter() - dispatched_at
        state.metrics.observe("queue", grant.waited_s, labels)
        state.metrics.observe("upstream_ttft", ttft, labels)
        record.timing("queue", grant.waited_s)
        record.timing("upstream_ttft", ttft)
        record.timing("ttft", time.monotonic() - record.started)  # client-side TTFT
        extra = [(b"x-switchyard-version", plan.version.label.encode("latin-1"))]
        record.status = 200
        try:
            result = await self._relay(state, upstream, plan, extra, labels, grant=grant)
        finally:
            await upstream.aclose()
        record.outcome = result.outcome
        record.itl_ms = result.gaps_ms  # per-version ITL for the rollout gate
        if result.usage is not None:
            record.prompt_tokens = result.usage.prompt_tokens
            record.completion_tokens = result.usage.completion_tokens
            grant.settle_output(result.usage.completion_tokens)
        return result.usage

    async def _relay(
        self,
        state: RouterState,
        upstream: UpstreamResponse,
        plan: Plan,
        extra: list[tuple[bytes, bytes]],
        labels: StageLabels,
        *,
        grant: Grant,
    ) -> RelayResult:
        if plan.streaming != upstream.is_stream:
            raise ApiError.of("upstream_error", reason="it answered in the wrong framing.")
        sink = self.relay_sink or self
        if plan.streaming:
            return await relay_stream(
                sink,
                upstream,
                kind=self.kind,
                include_usage=plan.include_usage,
                headers=extra,
                metrics=state.metrics,
                labels=labels,
                on_tokens=grant.charge_output,
                cut=lambda: self.cut_reason,
            )
        return await relay_unary(sink, upstream, headers=extra)


class ChatCompletionsConsumer(InferenceConsumer):
    route = "/v1/chat/completions"
    kind = "chat"
    upstream_path = "/v1/chat/completions"
    decoder = RequestDecoder(ChatRequest)


class CompletionsConsumer(InferenceConsumer):
    route = "/v1/completions"
    kind = "completion"
    upstream_path = "/v1/completions"
    decoder = RequestDecoder(CompletionRequest)


class EmbeddingsConsumer(CoalescedDispatch, InferenceConsumer):
    route = "/v1/embeddings"
    kind = "embedding"
    upstream_path = "/v1/embeddings"
    tasks = frozenset({"embedding"})
    decoder = RequestDecoder(EmbeddingRequest)
