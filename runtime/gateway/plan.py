"""Planning a request before dispatch: model, class, deadline, version, caps, upstream body.

The upstream body is the client's known fields, normalised: ``max_tokens`` always set (the
client's, or the tenant's cap shrunk to fit the context), the version's default sampling
where the client gave none, ``stream_options.include_usage`` always on for streams (the router
meters), and the class's band as ``priority`` where the pool enables it.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import msgspec

from runtime.gateway.auth import Principal
from runtime.gateway.caps import embedding_budget, generation_budget
from runtime.gateway.errors import ApiError
from runtime.gateway.resolve import resolve_class, resolve_model, resolve_timeout
from runtime.gateway.schema import ChatRequest, EmbeddingRequest, InferenceRequest, forwardable
from runtime.gateway.state import RouterState
from runtime.gateway.tokens import text_overheads
from runtime.routing.versions import NoVersionError, choose_version
from runtime.snapshot import ModelSnap, RequestClassSnap, Snapshot, VersionSnap
from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.metrics import StageLabels

GENERATIVE = frozenset({"chat", "completion"})
AFFINITY_PREFIX_CHARS = 256  # about four 16-token KV blocks at 4 characters per token
_SAMPLING_DEFAULTS = frozenset(
    {"temperature", "top_p", "stop", "presence_penalty", "frequency_penalty"}
)


class Plan(msgspec.Struct, kw_only=True):
    """What was decided before dispatch."""

    model: ModelSnap
    version: VersionSnap
    klass: RequestClassSnap | None
    deadline: float  # loop time
    streaming: bool
    include_usage: bool
    body: bytes
    prompt_tokens: int = 0  # counted (or estimated) before dispatch
    max_tokens: int = 0  # the output budget sent upstream (0 for embeddings)
    affinity_key: str | None = None  # hash of the prompt's first characters


async def plan_request(
    state: RouterState,
    snapshot: Snapshot,
    *,
    principal: Principal,
    request: InferenceRequest,
    route: str,
    tasks: frozenset[str],
    class_header: bytes | None,
    timeout_header: bytes | None,
    record: RequestRecord,
    labels: StageLabels,
) -> Plan:
    """Everything decided before dispatch; raises ApiError for every refusal."""
    tenant = principal.tenant
    model = resolve_model(snapshot, tenant, request.model, tasks=tasks, route=route)
    record.model = labels.model = model.name
    klass = resolve_class(snapshot, tenant, class_header)
    record.klass = labels.klass = klass.name if klass is not None else ""
    timeout_s = resolve_timeout(klass, timeout_header, state.config)
    deadline = asyncio.get_running_loop().time() + timeout_s
    try:
        version = choose_version(
            snapshot, model, tenant=tenant.slug, user=request.user, rng=state.rng
        )
    except NoVersionError as exc:
        raise ApiError.of("model_not_found", str(exc), param="model") from None
    record.version = labels.version = version.label
    document = forwardable(request)
    streaming = False
    include_usage = False
    max_tokens = 0
    if isinstance(request, EmbeddingRequest):
        record.prompt_tokens = await embedding_budget(
            state.tokens, tenant=tenant, version=version, texts=request.texts()
        )
    else:
        streaming, include_usage = request.streaming, request.include_usage
        record.stream = streaming
        is_chat = isinstance(request, ChatRequest)
        roles = [m.role for m in request.messages] if isinstance(request, ChatRequest) else None
        texts = request.texts()
        prompt, max_tokens = await generation_budget(
            state.tokens,
            tenant=tenant,
            version=version,
            texts=texts,
            overheads=text_overheads(texts, roles),
            requested_max_tokens=request.requested_max_tokens(),
            param="max_completion_tokens"
            if is_chat and document.get("max_completion_tokens") is not None
            else "max_tokens",
            prompt_param="messages" if is_chat else "prompt",
        )
        record.prompt_tokens = prompt.tokens
        document.pop("max_completion_tokens", None)
        document["max_tokens"] = max_tokens
        for key, value in version.default_sampling.items():
            if key in _SAMPLING_DEFAULTS and key not in document and value is not None:
                document[key] = list(value) if isinstance(value, tuple) else value
        document["stream"] = streaming
        if streaming:
            document["stream_options"] = {"include_usage": True}
    _add_priority(snapshot, state, version, klass, document)
    return Plan(
        model=model,
        version=version,
        klass=klass,
        deadline=deadline,
        streaming=streaming,
        include_usage=include_usage,
        body=msgspec.json.encode(document),
        prompt_tokens=record.prompt_tokens or 0,
        max_tokens=max_tokens,
        affinity_key=affinity_key(request.texts()),
    )


def affinity_key(texts: list[str], prefix_chars: int = AFFINITY_PREFIX_CHARS) -> str | None:
    """A short hash of the prompt's first ``prefix_chars`` characters (prefix affinity):
    requests that share a system prompt or a conversation's start hash alike."""
    head = "\0".join(texts)[:prefix_chars]
    if not head:
        return None
    return hashlib.blake2b(head.encode("utf-8", "replace"), digest_size=8).hexdigest()


def _add_priority(
    snapshot: Snapshot,
    state: RouterState,
    version: VersionSnap,
    klass: RequestClassSnap | None,
    document: dict[str, Any],
) -> None:
    """vLLM takes ``priority`` only with ``--scheduling-policy priority``: per-pool flag."""
    if klass is None:
        return
    if state.table.policies(snapshot, version.id).get("upstream_priority") == "on":
        document["priority"] = klass.priority_band
