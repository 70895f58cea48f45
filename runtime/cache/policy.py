"""What is cacheable, and the cache key.

A request is cacheable when its answer is a function of the request: ``temperature`` 0 (the
request's, else the version's default sampling), or a fixed ``seed`` on a runtime that is
deterministic for a seed; one choice (``n`` = 1, no ``best_of``); no tools or functions (a
tool call may have side effects); no logprobs (a replay does not keep them). The operator turns
caching off per model (``CachePolicySnap.enabled``) or per tenant (``TenantSnap.result_cache``);
a client turns it off per request with ``Cache-Control: no-store``.

The key is the sha256 of the tenant scope (the tenant, or ``*`` for a model whose policy is
``shared``), the model version's digest (a new version never serves an old answer), the route
and the forwarded document, canonicalised (keys sorted), minus the fields that do not change
the output (``stream``, ``stream_options``, ``user``).
"""

from __future__ import annotations

import hashlib
from typing import Any, Final

import msgspec

from runtime.snapshot import ModelSnap, TenantSnap, VersionSnap

DETERMINISTIC_RUNTIMES: Final = frozenset({"simulator"})  # same seed -> same output
CACHED_ROUTES: Final = frozenset({"/v1/chat/completions", "/v1/completions"})
NEUTRAL_FIELDS: Final = ("stream", "stream_options", "user")
_TOOL_FIELDS: Final = ("tools", "functions", "tool_choice", "function_call")
_LOGPROB_FIELDS: Final = ("logprobs", "top_logprobs", "echo")


def no_store(cache_control: bytes | None) -> bool:
    """Whether a ``Cache-Control`` header asks not to use the cache."""
    if not cache_control:
        return False
    directives = {d.strip().lower() for d in cache_control.split(b",")}
    return b"no-store" in directives or b"no-cache" in directives


def cacheable(
    document: dict[str, Any],
    *,
    route: str,
    model: ModelSnap,
    version: VersionSnap,
    tenant: TenantSnap,
) -> bool:
    """Whether the answer to ``document`` may be stored and served again (see the module)."""
    if route not in CACHED_ROUTES or not model.cache.enabled or not tenant.result_cache:
        return False
    if document.get("n") not in (None, 1) or document.get("best_of") not in (None, 1):
        return False
    if any(document.get(name) for name in _TOOL_FIELDS):
        return False
    if any(document.get(name) for name in _LOGPROB_FIELDS):
        return False
    temperature = document.get("temperature")
    if temperature is None:
        temperature = version.default_sampling.get("temperature", 1.0)
    if isinstance(temperature, int | float) and temperature == 0:
        return True
    seed = document.get("seed")
    return isinstance(seed, int) and version.runtime in DETERMINISTIC_RUNTIMES


def version_tag(version: VersionSnap) -> str:
    """What names a model version in keys: its artifact digest, else its id."""
    return version.digest or f"id{version.id}"


def cache_scope(model: ModelSnap, tenant: TenantSnap) -> str:
    """The tenant an entry belongs to, or ``*`` for a model whose cache is shared."""
    return "*" if model.cache.shared else tenant.slug


def request_digest(document: dict[str, Any], *, route: str, neutral: tuple[str, ...]) -> str:
    """sha256 (hex) of the route and the canonical document minus ``neutral`` fields."""
    kept = {k: v for k, v in document.items() if k not in neutral}
    canonical = msgspec.json.encode([route, kept], order="sorted")
    return hashlib.sha256(canonical).hexdigest()


def cache_key(document: dict[str, Any], *, route: str, scope: str, version: VersionSnap) -> str:
    """The key of a cacheable request (see the module)."""
    inner = request_digest(document, route=route, neutral=NEUTRAL_FIELDS)
    return hashlib.sha256(f"{scope}\x00{version_tag(version)}\x00{inner}".encode()).hexdigest()
