"""The backends' prefix caches around a measured phase: reset them, then read their hit rate.

Every target plays a phase against the same backends, one target after the other, so a target
would otherwise inherit the caches the previous one warmed. Before each measured phase the
runner resets every backend's prefix cache (``POST /reset_prefix_cache``: the simulator always
serves it, vLLM with ``VLLM_SERVER_DEV_MODE=1``; a backend that refuses is noted, not fatal)
and reads vLLM's counters ``vllm:prefix_cache_queries`` / ``vllm:prefix_cache_hits`` (tokens)
before and after, so the phase's figures carry the engines' own hit rate.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import aiohttp

from bench.backends import gauge
from bench.procs import Child

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"
_TIMEOUT = aiohttp.ClientTimeout(total=5)


async def reset_prefix_caches(session: aiohttp.ClientSession, backends: Sequence[Child]) -> bool:
    """Reset every backend's prefix cache; False if one did not confirm."""

    async def one(child: Child) -> bool:
        try:
            async with session.post(
                f"{child.base_url}/reset_prefix_cache", timeout=_TIMEOUT
            ) as resp:
                if resp.status != 200:
                    return False
                body = await resp.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return False
        return isinstance(body, dict) and body.get("success") is True

    return all(await asyncio.gather(*(one(child) for child in backends)))


async def prefix_counters(
    session: aiohttp.ClientSession, backends: Sequence[Child]
) -> tuple[float, float]:
    """(queried tokens, hit tokens) summed over the backends (0 where a scrape fails)."""

    async def one(child: Child) -> tuple[float, float]:
        try:
            async with session.get(f"{child.base_url}/metrics", timeout=_TIMEOUT) as resp:
                text = await resp.text()
        except (aiohttp.ClientError, TimeoutError):
            return 0.0, 0.0
        return gauge(text, QUERIES), gauge(text, HITS)

    pairs = await asyncio.gather(*(one(child) for child in backends))
    return sum(q for q, _ in pairs), sum(h for _, h in pairs)


def prefix_figures(
    before: tuple[float, float], after: tuple[float, float], *, reset: bool
) -> dict[str, Any]:
    """The phase's prefix-cache figures from the counters before and after it."""
    queries, hits = after[0] - before[0], after[1] - before[1]
    return {
        "queried_tokens": queries,
        "hit_tokens": hits,
        "hit_rate": hits / queries if queries > 0 else None,
        "caches_reset": reset,
    }
