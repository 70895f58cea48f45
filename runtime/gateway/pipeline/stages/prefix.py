"""Stages ``prefix`` and ``prefix_started``: prefix-aware routing on the request path.

``prefix`` (before ``queue``): for a chat or completion request to an LLM pool (a version
not served by the torch runtime) whose pool does not turn it off (pool policy
``prefix_routing: off``; on by default), the plan gets the rendered prompt's block hashes
(:class:`~runtime.routing.prefix.PromptPrefix`: chat messages in order, or the completion's
single text prompt; an adapter's name first, since an engine caches a LoRA's blocks apart).
The pool's placement then keeps the request on the endpoint holding its longest cached prefix
until that endpoint is saturated (the sticky rule, with the parameters the pool's policies
set: ``prefix_stickiness`` and the other :data:`~runtime.routing.sticky.STICKY_POLICY_KEYS`,
carried as ``PromptPrefix.rule``), and learns where the prefix went
(:mod:`runtime.routing.prefix_placer`). A request without full blocks (a prompt shorter than
one block), an embedding or a batch of completion prompts carries none; a prompt shorter than
one block is told by its length before anything is rendered or hashed. The pool's switch and
rule are read once per snapshot and version, not per request.

``prefix_started`` (after ``dispatch``): the upstream answered (its first byte), so the
request's prefill no longer counts as queued at its endpoint; the request's end does the
same if it never gets there (a refusal, a failure). A unary request's prefill is not counted
as queued at all (``PromptPrefix.queues``): its first byte is its whole answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any, Final

from runtime.gateway.bundles import AdmissionDeps
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.schema import ChatRequest, CompletionRequest
from runtime.pool_policies import PREFIX_ROUTING_KEY
from runtime.routing.prefix import (
    DEFAULT_BLOCK_CHARS,
    PromptPrefix,
    block_hashes,
    estimate_tokens,
    render_chat,
    rendered_length,
)
from runtime.routing.sticky import STICKY_POLICY_KEYS, StickyRule
from runtime.snapshot import Snapshot, VersionSnap, adapter_name

LLM_KINDS: Final = frozenset({"chat", "completion"})


def prefix_routing_on(policies: Mapping[str, str]) -> bool:
    """Prefix-aware routing is on unless the pool's ``prefix_routing`` policy is ``off``."""
    return policies.get(PREFIX_ROUTING_KEY, "on").strip() != "off"


def _messages(request: object, version: VersionSnap) -> list[tuple[str, str]] | None:
    """The prompt's ``(role, content)`` pairs as the router renders them, or None when it has
    no single prompt."""
    if isinstance(request, ChatRequest):
        messages = [(m.role, m.text()) for m in request.messages]
    elif isinstance(request, CompletionRequest) and isinstance(request.prompt, str):
        messages = [("prompt", request.prompt)]
    else:
        return None
    if version.base_version is not None:
        messages.insert(0, ("adapter", adapter_name(version)))
    return messages


def rendered_prompt(request: object, version: VersionSnap) -> str | None:
    """The prompt as the router hashes it, or None when it has no single prompt."""
    messages = _messages(request, version)
    return None if messages is None else render_chat(messages)


def prompt_prefix(
    request: object, version: VersionSnap, rule: StickyRule | None = None, *, stream: bool = True
) -> PromptPrefix | None:
    """The request's :class:`PromptPrefix`, or None when it has no full block.

    Its tokens are estimated from the rendering (:func:`~runtime.routing.prefix.estimate_tokens`,
    4 characters a token), the unit the index's cached tokens are in, not taken from the plan:
    without the model's tokenizer the plan's count is an upper bound of one token a byte (4x
    too many for English text), which made every uncached prefill look four times longer than
    the prefix it saves and released conversations from their engine at light load.

    A prompt whose rendering is shorter than one block is known to have none before it is
    rendered (:func:`~runtime.routing.prefix.rendered_length`): nothing is built for it."""
    messages = _messages(request, version)
    if messages is None or rendered_length(messages) < DEFAULT_BLOCK_CHARS:
        return None
    rendered = render_chat(messages)
    hashes = block_hashes(rendered)
    return PromptPrefix(
        hashes=hashes, prompt_tokens=estimate_tokens(rendered), rule=rule, queues=stream
    )


class PoolRules:
    """The sticky rule of each pool's policies, parsed once per set of values (bounded)."""

    __slots__ = ("_rules",)
    LIMIT: Final = 256

    def __init__(self) -> None:
        self._rules: dict[tuple[str | None, ...], StickyRule | None] = {}

    def rule(self, policies: Mapping[str, str]) -> StickyRule | None:
        """None where the pool sets none of the rule's keys (the placer's default applies)."""
        values = tuple(policies.get(key) for key in STICKY_POLICY_KEYS)
        if values in self._rules:
            return self._rules[values]
        rule = None if values.count(None) == len(values) else StickyRule.from_policies(policies)
        if len(self._rules) >= self.LIMIT:
            self._rules.clear()
        self._rules[values] = rule
        return rule


class PrefixBlocks:
    """The ``prefix`` stage. A pool's switch and sticky rule are read once per snapshot and
    version (:meth:`_pool`), not per request; the request's end releases its queued prefill
    through a ``partial`` of the placer's :meth:`~runtime.routing.prefix_placer.PrefixPlacer.
    started` (no closure per request)."""

    name = "prefix"

    def __init__(self, deps: AdmissionDeps) -> None:
        self._deps = deps
        self._rules = PoolRules()
        self._snapshot: object = None  # the snapshot ``_pools`` was read from
        self._pools: dict[int, tuple[bool, StickyRule | None]] = {}  # version id -> (on, rule)

    def _pool(self, snapshot: Snapshot, version_id: int) -> tuple[bool, StickyRule | None]:
        """Whether the version's pool routes by prefix, and its sticky rule (snapshots are
        immutable: cached until the next one)."""
        if snapshot is not self._snapshot:
            self._snapshot = snapshot
            self._pools = {}
        found = self._pools.get(version_id)
        if found is None:
            policies = self._deps.table.policies(snapshot, version_id)
            on = prefix_routing_on(policies)
            found = self._pools[version_id] = (on, self._rules.rule(policies) if on else None)
        return found

    async def __call__(self, ctx: RequestContext) -> None:
        plan = ctx.ready_plan
        version = plan.version
        if ctx.spec.kind not in LLM_KINDS or version.runtime == "torch" or ctx.request is None:
            return
        on, rule = self._pool(ctx.ready_snapshot, version.id)
        if not on:
            return
        view: Any = ctx.request.request
        prefix = prompt_prefix(view, version, rule, stream=plan.streaming)
        if prefix is None:
            return
        plan.prefix = prefix
        ctx.hold("prefix", partial(self._deps.prefix.started, prefix))


class PrefixStarted:
    name = "prefix_started"

    def __init__(self, deps: AdmissionDeps) -> None:
        self._placer = deps.prefix

    async def __call__(self, ctx: RequestContext) -> None:
        plan = ctx.plan
        if plan is not None and plan.prefix is not None:
            self._placer.started(plan.prefix)
