"""Measure a tier's throughput curve from a running vLLM-compatible engine (the simulator in
tests and examples): prefill tokens/s from the time to first token of a long prompt alone, and
decode tokens/s of ``b`` concurrent streams for each batch size ``b``.

The completions go through a :class:`~runtime.upstream.drain.DrainClient` (pass one in, or one
is opened for the measurement); an engine that does not answer 200, or cuts a stream short,
fails the measurement with the classified :class:`~runtime.upstream.errors.UpstreamError`.
"""

from __future__ import annotations

import asyncio
import os

import msgspec

from runtime.scaling.capacity import CurvePoint, TierCurve
from runtime.tls import upstream_context
from runtime.upstream.drain import DrainClient
from runtime.upstream.errors import UpstreamHTTPError

MEASURE_TIMEOUT_S = 300.0  # one completion of the measurement, start to end


async def _stream(
    http: DrainClient, url: str, model: str, prompt: str, max_tokens: int
) -> tuple[float, float, int]:
    """(seconds to the first token, seconds to the end, tokens) of one streaming completion."""
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
            "ignore_eos": True}  # fmt: skip
    answer = await http.post(f"{url}/v1/completions", msgspec.json.encode(body))
    if answer.status != 200:
        raise UpstreamHTTPError(answer.status, b"")
    if answer.broken is not None:
        raise answer.broken
    return answer.first_event_s or 0.0, answer.total_s, answer.events


async def measure_curve(
    url: str,
    model: str,
    *,
    batches: tuple[int, ...] = (1, 4, 16),
    prompt_words: int = 2000,
    output_tokens: int = 32,
    kv_tokens: int,
    client: DrainClient | None = None,
) -> TierCurve:
    http = client or DrainClient(timeout_s=MEASURE_TIMEOUT_S, tls=upstream_context(os.environ))
    try:
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
    finally:
        if client is None:
            await http.close()
    return TierCurve(kv_tokens=kv_tokens, points=points)
