"""Smallest sufficient model: a model alias resolves, per request, to its cheapest member that
fits the request.

An alias (``Snapshot.aliases``, e.g. a family name) lists member models of one task. For each
member the router takes the version its route would serve (the route's split, as for the model
itself) and keeps it when:

- the version declares every capability the request needs (``VersionSnap.capabilities``, of
  ``runtime.snapshot.CAPABILITIES``):
  ``tools`` (the body has ``tools`` or ``functions``), ``json_output`` (``response_format`` of
  type ``json_object`` or ``json_schema``), ``vision`` (an ``image_url`` / ``input_image``
  content part);
- the prompt (counted as the caps count it: the byte bound, the tokenizer when that is over)
  plus the request's ``max_tokens`` (1 when it gives none) fit the version's context for the
  tenant;
- the tenant may use the member (``TenantSnap.models``).

Of those, the cheapest for this request (prompt and output tokens at the version's price on
its pool's tier; an unpriced version costs nothing) serves; a tie goes to the member listed
first. Nothing fits: 400 ``model_alias_unfit`` saying why each member does not.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.gateway.caps import context_cap
from runtime.gateway.errors import ApiError
from runtime.gateway.tokens import TokenCounter
from runtime.routing.table import RoutingTable
from runtime.routing.versions import Headers, NoVersionError, choose_version
from runtime.snapshot import AliasSnap, ModelSnap, Snapshot, TenantSnap, VersionSnap

_JSON_FORMATS = frozenset({"json_object", "json_schema"})
_IMAGE_PARTS = frozenset({"image_url", "input_image"})


def required_capabilities(document: Mapping[str, Any]) -> frozenset[str]:
    """What the request body needs of the engine, by ``runtime.snapshot.CAPABILITIES`` name."""
    needs: set[str] = set()
    if document.get("tools") or document.get("functions"):
        needs.add("tools")
    response_format = document.get("response_format")
    if isinstance(response_format, Mapping) and response_format.get("type") in _JSON_FORMATS:
        needs.add("json_output")
    messages = document.get("messages")
    if isinstance(messages, list) and any(_has_image(m) for m in messages):
        needs.add("vision")
    return frozenset(needs)


def _has_image(message: object) -> bool:
    content = message.get("content") if isinstance(message, Mapping) else None
    return isinstance(content, list) and any(
        isinstance(part, Mapping) and part.get("type") in _IMAGE_PARTS for part in content
    )


def _cost(
    snapshot: Snapshot, table: RoutingTable, version: VersionSnap, tokens_in: int, tokens_out: int
) -> float:
    pool = snapshot.pools.get(table.pool_of(snapshot, version.id) or version.scale_pool)
    tier = pool.hardware_tier if pool is not None else ""
    for price in snapshot.prices:
        if price.version == version.id and price.hardware_tier == tier:
            return (tokens_in * price.input_per_1k + tokens_out * price.output_per_1k) / 1000.0
    return 0.0


async def resolve_alias(
    snapshot: Snapshot,
    alias: AliasSnap,
    *,
    tenant: TenantSnap,
    document: Mapping[str, Any],
    texts: Sequence[str],
    overheads: Sequence[int],
    max_tokens: int | None,
    tokens: TokenCounter,
    table: RoutingTable,
    rng: random.Random,
    user: str | None,
    headers: Headers,
) -> tuple[ModelSnap, VersionSnap]:
    """The member model (and the version of it) that serves this request; ApiError 400
    ``model_alias_unfit`` when none fits (see the module docstring)."""
    needs = required_capabilities(document)
    wanted = max_tokens or 1
    best: tuple[float, ModelSnap, VersionSnap] | None = None
    why: list[str] = []
    for name in alias.members:
        model = snapshot.models.get(name)
        if model is None or (tenant.models and name not in tenant.models):
            why.append(f"{name} is not available to you")
            continue
        try:
            version = choose_version(
                snapshot, model, tenant=tenant.slug, user=user, headers=headers, rng=rng
            )
        except NoVersionError:
            why.append(f"{name} has no version to serve")
            continue
        missing = needs.difference(version.capabilities)
        if missing:
            why.append(f"{name} lacks {', '.join(sorted(missing))}")
            continue
        cap = context_cap(tenant, version)
        prompt = await tokens.count(version, texts, overheads, budget=cap - wanted)
        if prompt.tokens + wanted > cap:
            why.append(f"{name} holds {cap} tokens, the request needs {prompt.tokens + wanted}")
            continue
        cost = _cost(snapshot, table, version, prompt.tokens, wanted)
        if best is None or cost < best[0]:
            best = (cost, model, version)
    if best is None:
        reason = "; ".join(why) or "it has no members"
        raise ApiError.of("model_alias_unfit", param="model", model=alias.name, reason=reason)
    return best[1], best[2]
