"""The tenant's and the model's token caps: ``max_tokens`` and the context length.

Checked before anything is dispatched; a request over a cap is a 400 that changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.gateway.errors import ApiError
from runtime.gateway.tokens import TokenCount, TokenCounter
from runtime.snapshot import TenantSnap, VersionSnap


def context_cap(tenant: TenantSnap, version: VersionSnap) -> int:
    cap = tenant.limits.max_context_tokens
    if version.max_context > 0:
        cap = min(cap, version.max_context)
    return cap


def _how(count: TokenCount, version: VersionSnap) -> str:
    if count.exact:
        return f"{count.tokens} tokens"
    return (
        f"up to {count.tokens} tokens (bounded by its byte length: no tokenizer is available "
        f"for {version.model}:{version.label})"
    )


def _default_max_tokens(tenant: TenantSnap, version: VersionSnap) -> int:
    default = version.default_sampling.get("max_tokens")
    cap = tenant.limits.max_output_tokens
    if isinstance(default, int) and not isinstance(default, bool) and default > 0:
        return min(default, cap)
    return cap


async def generation_budget(
    counter: TokenCounter,
    *,
    tenant: TenantSnap,
    version: VersionSnap,
    texts: Sequence[str],
    overheads: Sequence[int],
    requested_max_tokens: int | None,
    param: str,
    prompt_param: str,
    sequences: int = 1,
) -> tuple[TokenCount, int]:
    """The prompt count and the per-sequence ``max_tokens`` to send upstream, or ApiError
    400. ``sequences`` (n choices x prompts) share the tenant's output cap: with the client's
    ``max_tokens`` their product must fit it; without, each gets an equal share."""
    max_output = tenant.limits.max_output_tokens
    if requested_max_tokens is not None and requested_max_tokens * sequences > max_output:
        asked = requested_max_tokens * sequences
        raise ApiError.of(
            "max_tokens_exceeded",
            param=param,
            requested=asked
            if sequences == 1
            else f"{asked} ({sequences} x {requested_max_tokens})",
            cap=max_output,
        )
    if sequences > max_output:
        raise ApiError.of(
            "max_tokens_exceeded", param="n", requested=f"{sequences} sequences", cap=max_output
        )
    cap = context_cap(tenant, version)
    wanted = requested_max_tokens or max(1, _default_max_tokens(tenant, version) // sequences)
    prompt = await counter.count(version, texts, overheads, budget=cap - wanted)
    if requested_max_tokens is not None:
        if prompt.tokens + requested_max_tokens > cap:
            raise ApiError.of(
                "context_length_exceeded",
                param=prompt_param,
                reason=f"This model's maximum context length for you is {cap} tokens; the "
                f"prompt is {_how(prompt, version)} and {param} asks for "
                f"{requested_max_tokens} more.",
            )
        return prompt, requested_max_tokens
    room = min(wanted, cap - prompt.tokens)
    if room < 1:
        raise ApiError.of(
            "context_length_exceeded",
            param=prompt_param,
            reason=f"This model's maximum context length for you is {cap} tokens; the prompt "
            f"is {_how(prompt, version)}, leaving no room for a completion.",
        )
    return prompt, room


async def embedding_budget(
    counter: TokenCounter,
    *,
    tenant: TenantSnap,
    version: VersionSnap,
    texts: Sequence[str],
    overheads: Sequence[int] | None = None,
) -> int:
    """The total input count (bound or exact); ApiError 400 if one input is over the cap.
    ``overheads`` carries a token array's length (its text is empty)."""
    cap = context_cap(tenant, version)
    extras = overheads if overheads is not None else [0] * len(texts)
    total = 0
    for index, (text, extra) in enumerate(zip(texts, extras, strict=True)):
        count = await counter.count(version, [text], [extra], budget=cap)
        if count.tokens > cap:
            raise ApiError.of(
                "context_length_exceeded",
                param="input" if len(texts) == 1 else f"input[{index}]",
                reason=f"Input {index} is {_how(count, version)}; this model's maximum for "
                f"you is {cap} tokens.",
            )
        total += count.tokens
    return total
