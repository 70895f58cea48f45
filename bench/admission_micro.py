"""Admission through allowances versus the exact Redis path, at a given load and hold time.

``python -m bench.admission_micro [--rate 200] [--hold 0.5] [--seconds 4]`` admits requests
of one tenant (limits far away) at ``rate`` per second through one
:class:`~runtime.admission.redis_limits.RedisLimits` on ``REDIS_URL``, holds each for
``hold`` seconds (the request's time in flight), settles it, and prints the share of
requests that took the exact per-request Redis path, and the EVALSHA calls per request
(INFO commandstats: run it against a Redis nothing else uses for a clean count), once with
allowances and once without.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import time
import uuid
from collections.abc import Sequence

import redis

from runtime.admission.limits import Quota
from runtime.admission.redis_limits import RedisLimits

BIG = 10**9


async def _drive(
    url: str, *, rate: float, hold: float, seconds: float, allow: bool
) -> dict[str, int]:
    limits = RedisLimits(url, prefix=f"bench:admission:{uuid.uuid4().hex[:8]}",
                         allowance_ttl_s=1.0 if allow else None)  # fmt: skip
    await limits.start()
    quota = Quota(rpm=BIG, tpm=BIG, concurrency=BIG)
    sources: collections.Counter[str] = collections.Counter()
    tasks: set[asyncio.Task[None]] = set()

    async def one() -> None:
        lease = await limits.acquire("acme", quota, tokens=80)
        sources[lease.source] += 1
        await asyncio.sleep(hold)
        limits.settle(lease, actual_tokens=60, served=True)

    start, sent = time.monotonic(), 0
    while time.monotonic() - start < seconds:
        task = asyncio.create_task(one())
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
        await asyncio.sleep(max(0.0, start + sent / rate - time.monotonic()))
    await asyncio.gather(*tasks)
    await limits.stop()
    return dict(sources)


def _evalsha(client: redis.Redis[bytes]) -> int:
    return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.admission_micro")
    parser.add_argument("--rate", type=float, default=200.0, help="requests/s (%(default)s)")
    parser.add_argument("--hold", type=float, default=0.5, help="s in flight (%(default)s)")
    parser.add_argument("--seconds", type=float, default=4.0, help="(%(default)s)")
    args = parser.parse_args(argv)
    url = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")
    client: redis.Redis[bytes] = redis.Redis.from_url(url)
    try:
        for allow in (False, True):
            before = _evalsha(client)
            sources = asyncio.run(_drive(url, rate=args.rate, hold=args.hold,
                                         seconds=args.seconds, allow=allow))  # fmt: skip
            calls = _evalsha(client) - before
            total = sum(sources.values())
            exact = sources.get("redis", 0) / total
            print(f"allowances {'on ' if allow else 'off'}: {total} requests, exact path "
                  f"{exact:.1%}, EVALSHA per request {calls / total:.2f}")  # fmt: skip
    finally:
        client.close()


if __name__ == "__main__":
    main()
