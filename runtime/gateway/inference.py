"""The inference routes: POST /v1/chat/completions, /v1/completions, /v1/embeddings.

One request: authenticate, parse, resolve model/class/deadline, pick the version, check the
token caps, dispatch to the least-loaded healthy endpoint (retrying before the first byte),
relay. Every refusal happens before anything is sent upstream. Per-stage timings go to
Prometheus and to one JSON log line per request.
"""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any, ClassVar

import msgspec

from runtime.gateway.auth import authenticate, bearer_token
from runtime.gateway.consumers import GatewayConsumer, header
from runtime.gateway.errors import ApiError
from runtime.gateway.plan import GENERATIVE, Plan, plan_request
from runtime.gateway.relay import RelayResult, relay_stream, relay_unary
from runtime.gateway.schema import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    InferenceRequest,
    decode_request,
)
from runtime.gateway.state import RouterState
from runtime.gateway.upstream_errors import dispatch_error
from runtime.snapshot import EndpointSnap, Snapshot
from runtime.telemetry.logging import RequestRecord, log_request
from runtime.telemetry.metrics import StageLabels
from runtime.upstream.dispatch import open_with_retry
from runtime.upstream.errors import UpstreamError
from runtime.upstream.response import UpstreamResponse


class _Attempts:
    """The pick callback for open_with_retry; holds the in-flight slot of the current try.

    ``queue_s`` is the wait from "ready to dispatch" to the first endpoint choice (the
    scheduler's queue will live there; today it is only the routing decision), and
    ``dispatched_at`` the moment of that choice, where time to first token starts.
    """

    __slots__ = (
        "count",
        "current",
        "dispatched_at",
        "queue_s",
        "ready_at",
        "snapshot",
        "state",
        "version_id",
    )

    def __init__(
        self, state: RouterState, snapshot: Snapshot, version_id: int, ready_at: float
    ) -> None:
        self.state = state
        self.snapshot = snapshot
        self.version_id = version_id
        self.ready_at = ready_at
        self.dispatched_at = ready_at
        self.queue_s = 0.0
        self.current: int | None = None
        self.count = 0

    def __call__(self, exclude: frozenset[int]) -> EndpointSnap | None:
        self.release()
        if self.count == 0:
            self.dispatched_at = time.perf_counter()
            self.queue_s = self.dispatched_at - self.ready_at
        endpoint = self.state.table.pick(
            self.snapshot, self.version_id, self.state.signals, exclude
        )
        if endpoint is not None:
            self.current = endpoint.id
            self.count += 1
            self.state.inflight.acquire(endpoint.id)
            self.state.metrics.inflight.labels(str(endpoint.id)).inc()
        return endpoint

    def release(self) -> None:
        if self.current is not None:
            self.state.inflight.release(self.current)
            self.state.metrics.inflight.labels(str(self.current)).dec()
            self.current = None


class InferenceConsumer(GatewayConsumer):
    methods: ClassVar[tuple[str, ...]] = ("POST",)
    route: ClassVar[str] = ""
    kind: ClassVar[str] = ""  # "chat" | "completion" | "embedding"
    upstream_path: ClassVar[str] = ""
    tasks: ClassVar[frozenset[str]] = GENERATIVE
    decoder: ClassVar[msgspec.json.Decoder[Any]]

    async def respond(self, body: bytes) -> None:
        state = self.state
        record = RequestRecord(request_id=self.request_id, route=self.route)
        labels = StageLabels()
        try:
            await self._serve(state, body, record, labels)
        except ApiError as exc:
            record.status, record.outcome = exc.status, exc.code or "error"
            raise
        except asyncio.CancelledError:
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
        log_request(state.request_log, record)

    async def _serve(
        self, state: RouterState, body: bytes, record: RequestRecord, labels: StageLabels
    ) -> None:
        snapshot = state.snapshot
        if snapshot is None:
            raise ApiError.of("not_ready", "The router has no configuration snapshot yet.")
        started = time.perf_counter()
        try:
            principal = authenticate(
                snapshot, bearer_token(header(self.scope, b"authorization")), now=time.time()
            )
        finally:
            record.timing("auth", time.perf_counter() - started)
        record.tenant, record.api_key = principal.tenant.slug, principal.key.prefix
        state.key_usage.record(principal.key.prefix, time.time())
        request: InferenceRequest = decode_request(body, self.decoder)
        plan = await plan_request(
            state,
            snapshot,
            principal=principal,
            request=request,
            route=self.route,
            tasks=self.tasks,
            class_header=header(self.scope, b"x-switchyard-class"),
            timeout_header=header(self.scope, b"x-request-timeout"),
            record=record,
            labels=labels,
        )
        await self._dispatch(state, snapshot, plan, record, labels)

    async def _dispatch(
        self,
        state: RouterState,
        snapshot: Snapshot,
        plan: Plan,
        record: RequestRecord,
        labels: StageLabels,
    ) -> None:
        # Stage clocks use perf_counter: uvloop's loop.time() ticks in whole milliseconds.
        attempts = _Attempts(state, snapshot, plan.version.id, time.perf_counter())
        try:
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
                    headers={"X-Request-Id": self.request_id},
                    first_byte_cap=None if plan.streaming else math.inf,
                )
            except UpstreamError as exc:
                raise dispatch_error(exc, model=plan.model.name) from None
            finally:
                record.attempts = attempts.count
                if attempts.count > 1:
                    state.metrics.retries_total.labels(plan.model.name).inc(attempts.count - 1)
            record.endpoint = labels.endpoint = str(endpoint.id)
            ttft = time.perf_counter() - attempts.dispatched_at
            state.metrics.observe("queue", attempts.queue_s, labels)
            state.metrics.observe("upstream_ttft", ttft, labels)
            record.timing("queue", attempts.queue_s)
            record.timing("upstream_ttft", ttft)
            extra = [(b"x-switchyard-version", plan.version.label.encode("latin-1"))]
            record.status = 200
            try:
                result = await self._relay(state, upstream, plan, extra, labels)
            finally:
                await upstream.aclose()
        finally:
            attempts.release()
        record.outcome = result.outcome
        if result.usage is not None:
            record.prompt_tokens = result.usage.prompt_tokens
            record.completion_tokens = result.usage.completion_tokens

    async def _relay(
        self,
        state: RouterState,
        upstream: UpstreamResponse,
        plan: Plan,
        extra: list[tuple[bytes, bytes]],
        labels: StageLabels,
    ) -> RelayResult:
        if plan.streaming != upstream.is_stream:
            raise ApiError.of("upstream_error", "The model server answered in the wrong framing.")
        if plan.streaming:
            return await relay_stream(
                self,
                upstream,
                kind=self.kind,
                include_usage=plan.include_usage,
                headers=extra,
                metrics=state.metrics,
                labels=labels,
            )
        return await relay_unary(self, upstream, headers=extra)


class ChatCompletionsConsumer(InferenceConsumer):
    route = "/v1/chat/completions"
    kind = "chat"
    upstream_path = "/v1/chat/completions"
    decoder = msgspec.json.Decoder(ChatRequest)


class CompletionsConsumer(InferenceConsumer):
    route = "/v1/completions"
    kind = "completion"
    upstream_path = "/v1/completions"
    decoder = msgspec.json.Decoder(CompletionRequest)


class EmbeddingsConsumer(InferenceConsumer):
    route = "/v1/embeddings"
    kind = "embedding"
    upstream_path = "/v1/embeddings"
    tasks = frozenset({"embedding"})
    decoder = msgspec.json.Decoder(EmbeddingRequest)
