"""Measure a tier's throughput curve from a running vLLM-compatible engine (the simulator in
tests and examples): prefill tokens/s from the time to first token of a long prompt alone, and
decode tokens/s of ``b`` concurrent streams for each batch size ``b``."""

from __future__ import annotations

import asyncio
import time

import aiohttp

from runtime.scaling.capacity import CurvePoint, TierCurve


async def _stream(
    http: aiohttp.ClientSession, url: str, model: str, prompt: str, max_tokens: int
) -> tuple[float, float, int]:
    """(seconds to the first token, seconds to the end, tokens) of one streaming completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}  # fmt: skip
    started = time.perf_counter()
    first = 0.0
    tokens = 0
    async with http.post(f"{url}/v1/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.content:
            if line.startswith(b"data: {"):
                tokens += 1
                if not first:
                    first = time.perf_counter() - started
    return first, time.perf_counter() - started, tokens


async def measure_curve(
    url: str,
    model: str,
    *,
    batches: tuple[int, ...] = (1, 4, 16),
    prompt_words: int = 2000,
    output_tokens: int = 32,
    kv_tokens: int,
) -> TierCurve:
    async with aiohttp.ClientSession() as http:
        ttft, _, _ = await _stream(http, url, model, "word " * prompt_words, 1)
        prefill_tps = prompt_words * 5 / 4 / max(ttft, 1e-6)  # ~ceil(chars / 4) tokens
        points = []
        for b in batches:
            runs = await asyncio.gather(
                *(_stream(http, url, model, "hi", output_tokens) for _ in range(b))
            )
            span = max(end for _, end, _ in runs) - min(first for first, _, _ in runs)
            decode_tps = sum(n - 1 for _, _, n in runs) / max(span, 1e-6)
            points.append(CurvePoint(batch=b, prefill_tps=prefill_tps, decode_tps=decode_tps))
    return TierCurve(kv_tokens=kv_tokens, points=points)
