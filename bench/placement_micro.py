"""Micro-benchmark of the dispatcher's fast path over the router's real placement.

``python -m bench.placement_micro [--requests 20000] [--endpoints 1]`` runs ``PoolDispatcher``
(default pool settings) over :class:`~runtime.scheduling.placement.FleetPlacement` with the
router's own parts (routing table, fleet signals, breakers, a health monitor that never
scraped, the in-flight book) and a snapshot of one model with ``--endpoints`` ready endpoints
of 64 slots in one pool, at most 32 requests in flight (every request takes the fast path),
and prints the CPU time (``time.process_time``) per ``acquire`` + ``release``, best of three.
``bench.dispatch_micro`` measures the same over an in-memory placement; the difference is the
placement's. To compare with an older commit, copy this file and ``bench/dispatch_micro.py``
(its ``passes``) into a ``git archive`` of it and run it there with ``PYTHONPATH`` at that copy.
"""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Sequence

from bench.dispatch_micro import passes
from runtime.routing.inflight import InFlight
from runtime.routing.signals import FleetSignals
from runtime.routing.table import RoutingTable
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.placement import FleetPlacement
from runtime.scheduling.settings import PoolSettings
from runtime.testing.snapshots import SnapshotBuilder
from runtime.upstream.breaker import BreakerBook
from runtime.upstream.client import UpstreamClient
from runtime.upstream.health import HealthMonitor


async def measure(requests: int, *, endpoints: int, window: int = 32, repeats: int = 3) -> float:
    """Best CPU seconds per request over ``repeats`` passes of ``requests`` requests."""
    loop = asyncio.get_running_loop()
    builder = SnapshotBuilder().add_model("m", 1)
    for endpoint_id in range(1, endpoints + 1):
        builder.add_endpoint(endpoint_id, 1, pool="p", capacity=64)
    snapshot = builder.snapshot()
    health = HealthMonitor(UpstreamClient())
    health.set_endpoints(snapshot.endpoints.values())
    inflight = InFlight()
    placement = FleetPlacement(
        "p", snapshot=lambda: snapshot, table=RoutingTable(), health=health, inflight=inflight,
        signals=FleetSignals(breakers=BreakerBook(), health=health, inflight=inflight),
        clock=loop.time, on_slot=lambda endpoint_id, delta: None,
    )  # fmt: skip
    dispatcher = PoolDispatcher("p", PoolSettings(), placement, clock=loop.time)
    return await passes(dispatcher, requests, window=window, repeats=repeats)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.placement_micro")
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--endpoints", type=int, default=1)
    args = parser.parse_args(argv)
    per_request = asyncio.run(measure(args.requests, endpoints=args.endpoints))
    print(
        f"acquire + release over FleetPlacement ({args.endpoints} endpoints): "
        f"{per_request * 1e6:.1f} us CPU per request (best of 3)"
    )


if __name__ == "__main__":
    main()
