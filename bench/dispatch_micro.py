"""Micro-benchmark of the pool dispatcher's per-request CPU: ``acquire`` + ``release``.

``python -m bench.dispatch_micro [--requests 20000]`` runs ``PoolDispatcher`` (default pool
settings: VTC, EDF, headroom) over an in-memory placement of two endpoints with 64 slots each,
four tenants, at most 32 requests in flight (so every request finds a slot: the common,
uncontended path), and prints the CPU time (``time.process_time``) per request, best of
three. CPU time, not wall time: on a shared machine only the former is comparable between
runs. To compare with an older commit, run it with ``PYTHONPATH`` at a ``git archive`` of
that commit.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence

from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Grant, Ticket
from runtime.scheduling.settings import PoolSettings
from runtime.testing.fleet import HandFleet


async def measure(requests: int, *, window: int = 32, repeats: int = 3) -> float:
    """Best CPU seconds per request over ``repeats`` passes of ``requests`` requests."""
    loop = asyncio.get_running_loop()
    fleet = HandFleet()
    for endpoint_id in (1, 2):
        fleet.add(endpoint_id, capacity=64)
    dispatcher = PoolDispatcher("p", PoolSettings(), fleet, clock=loop.time)
    return await passes(dispatcher, requests, window=window, repeats=repeats)


async def passes(dispatcher: PoolDispatcher, requests: int, *, window: int, repeats: int) -> float:
    """Best CPU seconds per ``acquire`` + ``release`` of ``dispatcher`` (started, then stopped
    here) over ``repeats`` passes of ``requests`` tickets of version 1, ``window`` held."""
    loop = asyncio.get_running_loop()
    dispatcher.start()
    tickets = [
        Ticket(tenant=f"t{i % 4}", version=1, input_tokens=10, max_output_tokens=10, band=0,
               class_name="standard", shed_order=0, weight=1.0, deadline=loop.time() + 3600)
        for i in range(requests)
    ]  # fmt: skip
    best = float("inf")
    try:
        for _ in range(repeats):
            start = time.process_time()
            held: list[Grant] = []
            for ticket in tickets:
                held.append(await dispatcher.acquire(ticket))
                if len(held) > window:
                    held.pop(0).release()
            for grant in held:
                grant.release()
            best = min(best, time.process_time() - start)
    finally:
        await dispatcher.stop()
    return best / requests


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch_micro")
    parser.add_argument("--requests", type=int, default=20_000)
    args = parser.parse_args(argv)
    per_request = asyncio.run(measure(args.requests))
    print(f"acquire + release: {per_request * 1e6:.1f} us CPU per request (best of 3)")


if __name__ == "__main__":
    main()
