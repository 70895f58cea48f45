"""What credit escrow adds to admission: ``python -m bench.escrow [--requests N]``.

Runs the router's own admission path (:class:`runtime.admission.redis_limits.RedisLimits`:
one EVALSHA to admit, the settle batched in the background) against ``REDIS_URL`` twice —
limits only (a free request) and limits + escrow (a priced one, with a day cap) — one request
at a time, and prints the median and p99 admission latency and admissions per second of this
one core. Keys live under a fresh prefix, removed afterwards.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

import redis

from runtime.admission.credits import NO_ASK, CreditAsk
from runtime.admission.limits import Quota
from runtime.admission.redis_limits import RedisLimits
from runtime.contract import credit_key, period_fields

QUOTA = Quota(rpm=10**9, tpm=10**12, concurrency=10**6)


async def _run(url: str, prefix: str, requests: int, ask: CreditAsk) -> list[float]:
    limits = RedisLimits(url, prefix=prefix, usage_stream=f"{prefix}:usage")
    await limits.start()
    samples: list[float] = []
    try:
        for _ in range(requests):
            started = time.perf_counter()
            lease = await limits.acquire("bench", QUOTA, tokens=100, ask=ask)
            samples.append(time.perf_counter() - started)
            limits.settle(lease, actual_tokens=60, served=True, cost_uc=ask.need_uc // 2,
                          event=b'{"id":"x"}' if ask.need_uc else b"")  # fmt: skip
            await asyncio.sleep(0)
        await limits.flush()
    finally:
        await limits.stop()
    return samples


def _report(name: str, samples: list[float]) -> None:
    ordered = sorted(samples)
    p50 = statistics.median(ordered) * 1e6
    p99 = ordered[int(0.99 * (len(ordered) - 1))] * 1e6
    rate = len(samples) / sum(samples)
    print(f"{name:<22} p50 {p50:7.1f} µs   p99 {p99:7.1f} µs   {rate:8.0f} admissions/s/core")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    args = parser.parse_args()
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    prefix = f"switchyard:bench:escrow:{uuid.uuid4().hex[:8]}"
    client: redis.Redis[bytes] = redis.Redis.from_url(url)
    client.hset(credit_key(prefix, "bench"), "balance", 10**15)
    day, month = period_fields()
    priced = CreditAsk(need_uc=1_000, day_field=day, month_field=month, day_cap_uc=10**15)
    try:
        for _round in range(2):  # the first round warms the scripts and connections
            free = asyncio.run(_run(url, prefix, args.requests, NO_ASK))
            paid = asyncio.run(_run(url, prefix, args.requests, priced))
        _report("limits only", free)
        _report("limits + escrow", paid)
        added = (statistics.median(paid) - statistics.median(free)) * 1e6
        print(f"escrow adds {added:.1f} µs at the median")
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()


if __name__ == "__main__":
    main()
