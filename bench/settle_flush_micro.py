"""CPU of the limits settler's Redis write, per settlement (issue #27): a flush of ``--batch``
queued settlements sent as one settle script call (``batched``, what
:meth:`RedisLimits._write` does) against one call per settlement in one pipeline
(``per-call``, what it did before: the same script, the same keys and arguments, one
settlement per call). ABBA rounds of ``--flushes`` flushes each; this process's CPU
(``time.process_time``: redis-py's packing and parsing, the event loop; not Redis's),
microseconds per settlement. Needs a Redis (``--redis``; keys under a fresh prefix,
deleted at the end). No spool there; ``--spool DIR`` measures the spool's part of a flush
alone (no Redis): ``rotate`` + ``discard`` of the segment (what a flush did before) against
``applied`` (the current file truncated in place), ``--batch`` lines of a settlement's size
appended before each (not counted), the same ABBA rounds.

``python -m bench.settle_flush_micro --redis redis://127.0.0.1:6379/0 [--batch 25]
[--flushes 200] [--rounds 4]``; ``python -m bench.settle_flush_micro --spool /tmp/dir``
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from pathlib import Path

import msgspec
import redis

from runtime.admission.evalsha import pipelined
from runtime.admission.redis_limits import RedisLimits, Settlement
from runtime.admission.scripts import SETTLE_LUA
from runtime.admission.settle_calls import settle_calls
from runtime.contract import credit_key
from runtime.metering.spool import Spool

VARIANTS = ("per-call", "batched")
SPOOL_VARIANTS = ("rotate+discard", "truncate")


def _batch(size: int, tenants: int) -> list[Settlement]:
    event = '{"id":"%s","tenant":"t","tokens_in":60,"tokens_out":8,"cost_uc":76}'
    items = []
    for i in range(size):
        lease = uuid.uuid4().hex
        items.append(Settlement(f"tenant{i % tenants}", lease, 32, False, 76, "d:2026-11-27",
                                "m:2026-11", event % lease))  # fmt: skip
    return items


async def _flush(limits: RedisLimits, variant: str, batch: list[Settlement]) -> None:
    if variant == "batched":
        limits._settles = batch
        assert await limits._write() == len(batch)
        return
    calls = [settle_calls([item], limits.keys, limits._stream, limits._prefix)[0]
             for item in batch]  # fmt: skip  # one settlement per call
    assert limits._client is not None
    await pipelined(limits._client, limits._settle, SETTLE_LUA, calls)


async def measure(url: str, *, batch: int, tenants: int, flushes: int, rounds: int,
                  prefix: str) -> dict[str, list[float]]:  # fmt: skip
    limits = RedisLimits(url, prefix=prefix, usage_stream=f"{prefix}:usage",
                         allowance_ttl_s=None, settle_linger_s=3600.0)  # fmt: skip
    await limits.start()
    figures: dict[str, list[float]] = {v: [] for v in VARIANTS}
    try:
        for variant in VARIANTS:  # warm-up: scripts loaded, connections open
            await _flush(limits, variant, _batch(batch, tenants))
        for n in range(rounds):
            order = VARIANTS if n % 2 == 0 else VARIANTS[::-1]
            for variant in (*order, *order[::-1]):  # ABBA
                batches = [_batch(batch, tenants) for _ in range(flushes)]
                start = time.process_time()
                for items in batches:
                    await _flush(limits, variant, items)
                cpu = time.process_time() - start
                figures[variant].append(cpu / (flushes * batch) * 1e6)
    finally:
        await limits.stop()
    return figures


def measure_spool(root: Path, *, batch: int, flushes: int, rounds: int) -> dict[str, list[float]]:
    spool = Spool(root)
    spool.open()
    line = msgspec.json.encode(_batch(1, 1)[0])
    figures: dict[str, list[float]] = {v: [] for v in SPOOL_VARIANTS}
    try:
        for n in range(rounds):
            order = SPOOL_VARIANTS if n % 2 == 0 else SPOOL_VARIANTS[::-1]
            for variant in (*order, *order[::-1]):  # ABBA
                cpu = 0.0
                for _ in range(flushes):
                    for _ in range(batch):
                        spool.append(line)
                    start = time.process_time()
                    if variant == "truncate":
                        spool.applied(spool.mark())
                    else:
                        segment = spool.rotate()
                        if segment is not None:
                            spool.discard(segment)
                    cpu += time.process_time() - start
                figures[variant].append(cpu / flushes * 1e6)
    finally:
        spool.close()
    return figures


def _report(title: str, figures: dict[str, list[float]]) -> None:
    print(title)
    for variant, values in figures.items():
        print(f"  {variant:14s} {statistics.median(values):7.2f}  "
              f"({' / '.join(f'{v:.2f}' for v in values)})")  # fmt: skip
    (old, before), (new, after) = ((k, statistics.median(v)) for k, v in figures.items())
    print(f"  {new} / {old}: {after / before:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.settle_flush_micro",
                                     description=__doc__)  # fmt: skip
    parser.add_argument("--redis")
    parser.add_argument("--spool", type=Path, help="measure the spool's part instead (a dir)")
    parser.add_argument("--batch", type=int, default=25, help="settlements per flush")
    parser.add_argument("--tenants", type=int, default=1)
    parser.add_argument("--flushes", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    if args.spool is not None:
        figures = measure_spool(args.spool, batch=args.batch, flushes=args.flushes,
                                rounds=args.rounds)  # fmt: skip
        _report(f"spool, per flush of {args.batch} lines, CPU us per flush, median (rounds):",
                figures)  # fmt: skip
        return
    if args.redis is None:
        parser.error("--redis or --spool")
    prefix = f"switchyard:bench:settle-flush:{uuid.uuid4().hex[:8]}"
    client: redis.Redis[bytes] = redis.Redis.from_url(args.redis)
    for i in range(args.tenants):
        client.hset(credit_key(prefix, f"tenant{i}"), "balance", 10**15)
    try:
        figures = asyncio.run(measure(args.redis, batch=args.batch, tenants=args.tenants,
                                      flushes=args.flushes, rounds=args.rounds,
                                      prefix=prefix))  # fmt: skip
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*", count=10_000))
        for start in range(0, len(keys), 10_000):
            client.delete(*keys[start : start + 10_000])
        client.close()
    _report(f"settle flush of {args.batch} settlements ({args.tenants} tenant(s)), CPU us per "
            "settlement, median (rounds):", figures)  # fmt: skip


if __name__ == "__main__":
    main()
