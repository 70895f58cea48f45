"""Calibrate the simulator's prefill cost against an engine: TTFT versus prompt length.

``python -m bench.calibrate --url http://127.0.0.1:8000 --model NAME [--lengths 64,512,1024]
[--repeats 3]`` sends, one at a time, completions whose prompts are token ids (so the count is
exact on vLLM and on the simulator alike) with ``max_tokens = 1``, and measures each request's
latency (prefill plus one decode step plus the server's fixed cost):

- *cold*: a prompt no earlier request shares (its first token id differs), at each length;
- *warm*: the same prompt again right after, so the engine's prefix cache holds all of it but
  the last token (vLLM recomputes that one) and the whole-prompt prefill is saved.

It first resets the engine's prefix cache (``POST /reset_prefix_cache``: vLLM serves it with
``VLLM_SERVER_DEV_MODE=1``; without it the prompts' random salt still keeps them cold). It fits
``latency = fixed + tokens / prefill_tps`` by least squares to each length's *fastest* cold
request (the one least disturbed by other work on a shared machine) and prints (JSON) the
fitted ``prefill_tps`` (the simulator's ``--prefill-tps``), the fixed cost in ms, each length's
fastest cold and warm latencies, and the engine's prefix-cache counters over the run. Against the
simulator itself it recovers the configured ``--prefill-tps`` (a test checks this); against
real vLLM CPU it gives the figure to run the simulator with.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import aiohttp

from bench.backends import gauge

QUERIES = "vllm:prefix_cache_queries_total"
HITS = "vllm:prefix_cache_hits_total"
FIRST_ID = 10  # token ids below this are left alone (BOS, EOS, padding on small vocabularies)


@dataclass(frozen=True, slots=True)
class Point:
    tokens: int
    cold_ms: float
    warm_ms: float


def prompt_ids(tokens: int, salt: int, vocab: int) -> list[int]:
    """``tokens`` token ids; ``salt`` changes the first one (so no cache holds the prompt)."""
    span = vocab - FIRST_ID
    return [FIRST_ID + (salt + i * 7) % span for i in range(tokens)]


async def _latency_ms(
    session: aiohttp.ClientSession, url: str, model: str, ids: list[int]
) -> float:
    body = {"model": model, "prompt": ids, "max_tokens": 1, "temperature": 0.0}
    start = time.perf_counter()
    async with session.post(f"{url}/v1/completions", json=body) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"{url} answered {resp.status}")
    return (time.perf_counter() - start) * 1000.0


async def _counters(session: aiohttp.ClientSession, url: str) -> tuple[float, float]:
    async with session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    return gauge(text, QUERIES), gauge(text, HITS)


def fit(points: Sequence[tuple[int, float]]) -> tuple[float, float]:
    """Least squares ``ms = fixed_ms + tokens * ms_per_token``: (prefill_tps, fixed_ms)."""
    xs = [float(x) for x, _ in points]
    ys = [y for _, y in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mean_x) ** 2 for x in xs)
    if var == 0:
        raise ValueError("need at least two different prompt lengths")
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var
    fixed = mean_y - slope * mean_x
    tps = 1000.0 / slope if slope > 0 else float("inf")
    return tps, fixed


async def calibrate(
    url: str,
    model: str,
    *,
    lengths: Sequence[int],
    repeats: int = 3,
    vocab: int = 500,
) -> dict[str, Any]:
    """Measure cold and warm latencies at each length; the fit and the raw medians."""
    url = url.rstrip("/")
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        async with session.post(f"{url}/reset_prefix_cache") as resp:
            await resp.read()  # best effort: a refusal leaves the random salt to keep it cold
        await _latency_ms(session, url, model, prompt_ids(8, 0, vocab))  # warm the server up
        before = await _counters(session, url)
        points: list[Point] = []
        raw: list[tuple[int, float]] = []
        salt = random.randrange(1 << 20)  # a fresh prompt every run
        for tokens in lengths:
            cold, warm = [], []
            for _ in range(repeats):
                salt += 1
                ids = prompt_ids(tokens, salt, vocab)
                cold.append(await _latency_ms(session, url, model, ids))
                warm.append(await _latency_ms(session, url, model, ids))
            raw.append((tokens, min(cold)))
            points.append(Point(tokens, min(cold), min(warm)))
        after = await _counters(session, url)
    tps, fixed = fit(raw)
    return {
        "url": url,
        "model": model,
        "prefill_tps": round(tps, 1),
        "fixed_ms": round(fixed, 2),
        "points": [
            {"tokens": p.tokens, "cold_ms": round(p.cold_ms, 2), "warm_ms": round(p.warm_ms, 2)}
            for p in points
        ],
        "prefix_cache": {
            "queried_tokens": after[0] - before[0],
            "hit_tokens": after[1] - before[1],
        },
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.calibrate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--url", required=True, help="the engine's base URL (no /v1)")
    parser.add_argument("--model", required=True, help="the served model name")
    parser.add_argument("--lengths", default="64,256,512,1024,1536", help="prompt tokens, CSV")
    parser.add_argument("--repeats", type=int, default=3, help="requests per length and kind")
    parser.add_argument("--vocab", type=int, default=500, help="token ids stay below this")
    args = parser.parse_args(argv)
    lengths = [int(part) for part in args.lengths.split(",") if part.strip()]
    result = asyncio.run(
        calibrate(args.url, args.model, lengths=lengths, repeats=args.repeats, vocab=args.vocab)
    )
    sys.stdout.write(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
