"""Result-cache bench: W-TinyLFU (the router's L1, ``theine``) vs plain LRU at the same byte
budget on a Zipf(0.99) prompt-popularity trace, and the router-side cost of an L1 hit.

    PYTHONPATH=$PWD .venv/bin/python bench/cache_policy.py [--keys 100000] [--requests 1000000]

Entry sizes are fixed per key (drawn once, log-uniform 0.5-8 KiB, like short completions).
Policies compared at the same byte budget:

- ``lru-bytes``: LRU evicting until the bytes fit (the best a plain LRU can do with the budget);
- ``lru-slots``: LRU with the L1's own rule (``budget // max_entry_bytes`` entries);
- ``wtinylfu``: :class:`runtime.cache.store.L1` (theine W-TinyLFU, same slot rule: strict);
- ``wtinylfu-mean``: the same with ``slot_bytes`` = the mean entry size (budget on average).

"Engine load saved" is the hit ratio: each hit is a request that did not reach an engine.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections import OrderedDict
from collections.abc import Callable

import numpy as np
from prometheus_client import CollectorRegistry

from runtime.cache.entry import CachedUsage, Entry, sse_frames, unary_body
from runtime.cache.metrics import CacheMetrics
from runtime.cache.store import L1, StoreConfig

MAX_ENTRY = 8 * 1024


def zipf_trace(keys: int, requests: int, s: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    ranks = np.arange(1, keys + 1, dtype=np.float64)
    weights = ranks**-s
    weights /= weights.sum()
    popularity = rng.permutation(keys)  # popular keys are not the small ids
    return popularity[rng.choice(keys, size=requests, p=weights)]


def lru(trace: np.ndarray, sizes: np.ndarray, budget: int, *, slots: int | None) -> float:
    cache: OrderedDict[int, int] = OrderedDict()
    used = hits = 0
    for raw in trace:
        key = int(raw)
        if key in cache:
            cache.move_to_end(key)
            hits += 1
            continue
        size = int(sizes[key])
        cache[key] = size
        used += size
        while (used > budget if slots is None else len(cache) > slots) and cache:
            _, gone = cache.popitem(last=False)
            used -= gone
    return hits / len(trace)


def entry(key: int, size: int) -> Entry:
    usage = CachedUsage(10, size // 4, 10 + size // 4)
    return Entry(kind="chat", id=f"c{key}", created=0, model="m", chunks=("x" * size,),
                 finish_reason="stop", usage=usage)  # fmt: skip


def wtinylfu(trace: np.ndarray, sizes: np.ndarray, budget: int, slot_bytes: int = 0) -> float:
    config = StoreConfig(l1_bytes=budget, max_entry_bytes=MAX_ENTRY, l1_ttl_s=3600,
                         slot_bytes=slot_bytes)  # fmt: skip
    l1 = L1(config, CacheMetrics(CollectorRegistry()))
    hits = 0
    made: dict[int, Entry] = {}
    for raw in trace:
        key = int(raw)
        name = str(key)
        if l1.get(name) is not None:
            hits += 1
            continue
        value = made.get(key) or entry(key, int(sizes[key]))
        made[key] = value
        l1.put(name, value, int(sizes[key]))
    return hits / len(trace)


def hit_latency(samples: int) -> dict[str, float]:
    """Microseconds per L1 hit + render (unary JSON, and SSE of a 64-chunk stream)."""
    l1 = L1(StoreConfig(), CacheMetrics(CollectorRegistry()))
    stream = Entry(kind="chat", id="c", created=0, model="m", chunks=tuple(["tok "] * 64),
                   finish_reason="stop", usage=CachedUsage(10, 64, 74))  # fmt: skip
    l1.put("k", stream, 2048)
    out: dict[str, float] = {}

    def sse(e: Entry) -> bytes:
        return b"".join(sse_frames(e, include_usage=True))

    renders: tuple[tuple[str, Callable[[Entry], bytes]], ...] = (
        ("unary", unary_body),
        ("sse", sse),
    )
    for name, render in renders:
        times: list[float] = []
        for _ in range(samples):
            started = time.perf_counter()
            got = l1.get("k")
            assert got is not None
            render(got)
            times.append((time.perf_counter() - started) * 1e6)
        times.sort()
        out[f"{name}_p50_us"] = statistics.median(times)
        out[f"{name}_p99_us"] = times[int(len(times) * 0.99)]
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--zipf", type=float, default=0.99)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    sizes = np.array([int(512 * 16 ** rng.random()) for _ in range(args.keys)])
    trace = zipf_trace(args.keys, args.requests, args.zipf, args.seed)
    print(f"keys={args.keys} requests={args.requests} zipf={args.zipf} "
          f"mean_entry={sizes.mean():.0f}B")  # fmt: skip
    mean = int(sizes.mean())
    print("budget_MiB  lru-bytes  lru-slots  wtinylfu  wtinylfu-mean  (hit ratio = load saved)")
    for mib in (1, 4, 16, 64):
        budget = mib * 1024 * 1024
        slots = budget // MAX_ENTRY
        row = (lru(trace, sizes, budget, slots=None), lru(trace, sizes, budget, slots=slots),
               wtinylfu(trace, sizes, budget), wtinylfu(trace, sizes, budget, mean))  # fmt: skip
        print(f"{mib:>10}  " + "  ".join(f"{r:9.3f}" for r in row))
    print("L1 hit + render:", {k: round(v, 1) for k, v in hit_latency(20_000).items()})


if __name__ == "__main__":
    main()
