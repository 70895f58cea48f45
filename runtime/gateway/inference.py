"""The inference routes: POST /v1/chat/completions, /v1/completions, /v1/embeddings.

Each request runs the router's inference :class:`~runtime.gateway.pipeline.stage.Pipeline`
(authenticate, plan, idempotency, admit, mirror, cache, queue, dispatch, relay; see
:mod:`runtime.gateway.pipeline.build`) over one
:class:`~runtime.gateway.pipeline.context.RequestContext`, whose exit stack gives back what
the stages took (the limits' settlement, the grant, the cache job) exactly once, then the
request is accounted (metrics, SLIs, tracing, the live view, one JSON log line). Every refusal
happens before anything is sent upstream.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any, ClassVar

from runtime.gateway.consumers import GatewayConsumer
from runtime.gateway.errors import ApiError
from runtime.gateway.pipeline.context import RequestContext, RouteSpec
from runtime.gateway.pipeline.stage import Pipeline
from runtime.gateway.pipeline.stages.account import Account, classify
from runtime.gateway.plan import GENERATIVE
from runtime.gateway.schema import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    RequestDecoder,
)
from runtime.gateway.unary import CoalescedDispatch
from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.metrics import StageLabels
from runtime.telemetry.tracing import Tracing


class InferenceConsumer(GatewayConsumer):
    methods: ClassVar[tuple[str, ...]] = ("POST",)
    route: ClassVar[str] = ""
    kind: ClassVar[str] = ""  # "chat" | "completion" | "embedding" | "classification"
    upstream_path: ClassVar[str] = ""
    tasks: ClassVar[frozenset[str]] = GENERATIVE
    decoder: ClassVar[RequestDecoder[Any]]
    coalesced: ClassVar[bool] = False
    spec: ClassVar[RouteSpec]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if getattr(cls, "decoder", None) is not None and cls.route:
            cls.spec = RouteSpec(route=cls.route, kind=cls.kind, upstream_path=cls.upstream_path,
                                 tasks=cls.tasks, decoder=cls.decoder,
                                 coalesced=cls.coalesced)  # fmt: skip

    def respond(self, body: bytes) -> Coroutine[Any, Any, None]:
        """The request's :func:`serve` coroutine itself (no frame of this method's own on
        every resume of the request's task, issue #27)."""
        raw = self.scope.get("headers", ())
        ctx = RequestContext(
            spec=self.spec,
            request_id=self.request_id,
            body=body,
            # By lower-case name, the first value of each (built once: ~6 reads per request,
            # most of them of a header the request does not have).
            headers=dict(reversed(raw)).get,
            raw_headers=raw,
            client=self,
            cut=self.current_cut,
            record=RequestRecord(request_id=self.request_id, route=self.route),
        )
        state = self.state
        return serve(ctx, pipeline=state.pipeline, account=state.account, tracing=state.tracing)

    def on_refused(self, error: ApiError) -> None:
        record = RequestRecord(request_id=self.request_id, route=self.route)
        record.status, record.outcome = error.status, error.code or "error"
        self.state.account(record, StageLabels())


async def serve(
    ctx: RequestContext, *, pipeline: Pipeline, account: Account, tracing: Tracing
) -> None:
    """Run the inference ``pipeline`` over ``ctx``, then ``account`` for the request."""
    record = ctx.record
    if tracing.enabled:
        tracing.begin(record, ctx.headers(b"traceparent"))
    try:
        await pipeline.run(ctx)
    except BaseException as exc:
        classify(record, exc, ctx.cut())
        raise
    finally:
        account(record, ctx.labels)


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
