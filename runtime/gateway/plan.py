"""Planning a request before dispatch: model, class, deadline, version, caps, upstream body.

The upstream body is the client's JSON document as it came (every field the router does not
read passes through; ``model`` is already the registry name the engine serves under), with
only what the router must set: ``max_tokens`` always set (the
client's, or the tenant's cap shrunk to fit the context; ``max_completion_tokens`` folded into
it), the version's default sampling where the client gave none,
``stream_options.include_usage`` on for streams (the router meters; the client's other stream
options stay), and the class's band as ``priority`` where the pool enables it (a client's
``priority`` is dropped: the band comes from the request class). A field the model's operator
refused (``ModelSnap.refused_fields``) is a 400 ``unsupported_parameter``.

``n`` choices (and a batch of prompts) multiply the output budget: ``Plan.max_tokens`` is the
whole request's output budget (per-choice ``max_tokens`` x n x prompts), which admission,
the tenant's output cap and the fairness charge count.
"""

from __future__ import annotations

import asyncio
import hashlib
from typing import Any

import msgspec

from runtime.gateway.aliases import resolve_alias
from runtime.gateway.auth import Principal
from runtime.gateway.bundles import PlanningDeps
from runtime.gateway.caps import embedding_budget, generation_budget
from runtime.gateway.errors import ApiError
from runtime.gateway.resolve import resolve_class, resolve_model, resolve_timeout
from runtime.gateway.schema import (
    ChatRequest,
    CompletionRequest,
    Decoded,
    EmbeddingRequest,
    InferenceRequest,
)
from runtime.gateway.tokens import prefill_estimate, text_overheads
from runtime.routing.prefix import PromptPrefix
from runtime.routing.versions import Headers, NoVersionError, choose_version
from runtime.snapshot import (
    ModelSnap,
    RequestClassSnap,
    Snapshot,
    TenantSnap,
    VersionSnap,
    adapter_name,
)
from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.metrics import StageLabels

GENERATIVE = frozenset({"chat", "completion"})
AFFINITY_PREFIX_CHARS = 256  # about four 16-token KV blocks at 4 characters per token
_SAMPLING_DEFAULTS = frozenset(
    {"temperature", "top_p", "stop", "presence_penalty", "frequency_penalty"}
)
_ENCODER = msgspec.json.Encoder()


class Plan(msgspec.Struct, kw_only=True):
    """What was decided before dispatch."""

    model: ModelSnap
    version: VersionSnap
    klass: RequestClassSnap | None
    deadline: float  # loop time
    streaming: bool
    include_usage: bool
    body: bytes
    prompt_tokens: int = 0  # counted (or bounded from above) before dispatch
    prefill_tokens: int = 0  # the prompt's tokens estimated (tokens.prefill_estimate); 0: unknown
    max_tokens: int = 0  # the whole output budget: per-choice max_tokens x n x prompts
    affinity_key: str | None = None  # hash of the prompt's first characters
    prefix: PromptPrefix | None = None  # the prompt's block hashes (stage ``prefix``)


async def plan_request(
    deps: PlanningDeps,
    snapshot: Snapshot,
    *,
    principal: Principal,
    request: Decoded[Any],
    route: str,
    tasks: frozenset[str],
    class_header: bytes | None,
    timeout_header: bytes | None,
    record: RequestRecord,
    labels: StageLabels,
    headers: Headers = (),
    model_name: str | None = None,
) -> Plan:
    """Everything decided before dispatch; raises ApiError for every refusal. ``model_name``
    replaces the body's model (a fallback degradation)."""
    tenant = principal.tenant
    view: InferenceRequest = request.request
    document = request.document
    model, version = await _model_and_version(
        deps, snapshot, tenant, request, model_name or view.model, tasks=tasks, route=route,
        headers=headers,
    )  # fmt: skip
    record.model = labels.model = model.name
    # an alias's member, or a fallback: what the engine serves; an adapter: its LoRA name
    document["model"] = model.name if version.base_version is None else adapter_name(version)
    for name in model.refused_fields:
        if name in document:
            raise ApiError.of("unsupported_parameter", param=name, model=model.name)
    klass = resolve_class(snapshot, tenant, class_header)
    record.klass = labels.klass = klass.name if klass is not None else ""
    timeout_s = resolve_timeout(klass, timeout_header, deps.config)
    deadline = asyncio.get_running_loop().time() + timeout_s
    record.version = labels.version = version.label
    document.pop("priority", None)
    streaming = False
    include_usage = False
    budget = prefill = 0
    if isinstance(view, EmbeddingRequest):
        texts, extras = view.inputs()
        record.prompt_tokens = await embedding_budget(
            deps.tokens, tenant=tenant, version=version, texts=texts, overheads=extras
        )
    else:
        streaming, include_usage = view.streaming, view.include_usage
        record.stream = streaming
        budget, prefill = await _generation(
            deps, tenant=tenant, version=version, view=view, document=document, record=record
        )
        for key, value in version.default_sampling.items():
            if key in _SAMPLING_DEFAULTS and key not in document and value is not None:
                document[key] = list(value) if isinstance(value, tuple) else value
        if streaming:
            options = document.get("stream_options")
            document["stream_options"] = {
                **(options if isinstance(options, dict) else {}),
                "include_usage": True,
            }
    _add_priority(snapshot, deps, version, klass, document)
    return Plan(
        model=model,
        version=version,
        klass=klass,
        deadline=deadline,
        streaming=streaming,
        include_usage=include_usage,
        body=_ENCODER.encode(document),
        prompt_tokens=record.prompt_tokens or 0,
        prefill_tokens=prefill,
        max_tokens=budget,
        affinity_key=affinity_key(view.texts()),
    )


async def _model_and_version(
    deps: PlanningDeps,
    snapshot: Snapshot,
    tenant: TenantSnap,
    request: Decoded[Any],
    name: str,
    *,
    tasks: frozenset[str],
    route: str,
    headers: Headers,
) -> tuple[ModelSnap, VersionSnap]:
    """The model named (or an alias's cheapest fitting member) and the version to serve."""
    view: InferenceRequest = request.request
    alias = snapshot.aliases.get(name)
    if alias is not None:
        if alias.task not in tasks:
            raise ApiError.of(
                "unsupported_model_task", param="model", model=name, task=alias.task, route=route
            )
        texts, overheads, _ = prompt_texts(view)
        wanted = None if isinstance(view, EmbeddingRequest) else view.requested_max_tokens()
        return await resolve_alias(
            snapshot, alias, tenant=tenant, document=request.document, texts=texts,
            overheads=overheads, max_tokens=wanted, tokens=deps.tokens, table=deps.table,
            rng=deps.rng, user=view.user, headers=headers,
        )  # fmt: skip
    model = resolve_model(snapshot, tenant, name, tasks=tasks, route=route)
    try:
        version = choose_version(
            snapshot, model, tenant=tenant.slug, user=view.user, headers=headers, rng=deps.rng
        )
    except NoVersionError:
        raise ApiError.of("model_not_found", param="model", model=model.name) from None
    return model, version


def prompt_texts(view: InferenceRequest) -> tuple[list[str], list[int], int]:
    """The texts the caps count, their overheads and the number of prompts (a completion
    batch counts only its longest prompt: each is its own sequence)."""
    if isinstance(view, ChatRequest):
        texts = view.texts()
        return texts, text_overheads(texts, [m.role for m in view.messages]), 1
    texts, overheads = view.inputs()
    prompts = len(texts)
    if isinstance(view, CompletionRequest) and prompts > 1:
        longest = max(range(prompts), key=lambda i: len(texts[i]) * 4 + overheads[i])
        texts, overheads = [texts[longest]], [overheads[longest]]
    return texts, overheads, prompts


async def _generation(
    deps: PlanningDeps,
    *,
    tenant: TenantSnap,
    version: VersionSnap,
    view: ChatRequest | CompletionRequest,
    document: dict[str, Any],
    record: RequestRecord,
) -> tuple[int, int]:
    """Check the caps, set ``max_tokens`` in ``document``; the whole output budget and the
    prompt's estimated tokens (:func:`~runtime.gateway.tokens.prefill_estimate`)."""
    is_chat = isinstance(view, ChatRequest)
    texts, overheads, prompts = prompt_texts(view)
    prompt, max_tokens = await generation_budget(
        deps.tokens,
        tenant=tenant,
        version=version,
        texts=texts,
        overheads=overheads,
        requested_max_tokens=view.requested_max_tokens(),
        sequences=view.choices * prompts,
        param="max_completion_tokens"
        if is_chat and document.get("max_completion_tokens") is not None
        else "max_tokens",
        prompt_param="messages" if is_chat else "prompt",
    )
    record.prompt_tokens = prompt.tokens * prompts
    document.pop("max_completion_tokens", None)
    document["max_tokens"] = max_tokens
    return max_tokens * view.choices * prompts, prefill_estimate(prompt, texts, overheads) * prompts


def affinity_key(texts: list[str], prefix_chars: int = AFFINITY_PREFIX_CHARS) -> str | None:
    """A short hash of the prompt's first ``prefix_chars`` characters (prefix affinity):
    requests that share a system prompt or a conversation's start hash alike."""
    head = "\0".join(texts)[:prefix_chars]
    if not head:
        return None
    return hashlib.blake2b(head.encode("utf-8", "replace"), digest_size=8).hexdigest()


def _add_priority(
    snapshot: Snapshot,
    deps: PlanningDeps,
    version: VersionSnap,
    klass: RequestClassSnap | None,
    document: dict[str, Any],
) -> None:
    """vLLM takes ``priority`` only with ``--scheduling-policy priority``: per-pool flag."""
    if klass is None:
        return
    if deps.table.policies(snapshot, version.id).get("upstream_priority") == "on":
        document["priority"] = klass.priority_band
