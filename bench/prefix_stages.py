"""CPU per request of prefix-aware routing as the router runs it.

``python -m bench.prefix_stages [--iterations 5000] [--endpoints 4] [--dispatch 20000]`` times,
with ``time.process_time``:

- the ``prefix`` stage (:class:`~runtime.gateway.pipeline.stages.prefix.PrefixBlocks`) on a
  request context as the pipeline builds it, for a pool with ``prefix_routing: off`` (the
  early return) and with it on (the default), its request-end release included;
- the placer's share of one placement (:class:`~runtime.routing.prefix_placer.PrefixPlacer`
  over the router's :class:`~runtime.routing.kv_index.EventedPrefixIndex`, no KV events:
  match over ``endpoints`` endpoints, the sticky rule, the record at dispatch, and the
  ``prefix_started`` release);
- the ``prefix_started`` stage;

for two prompts: **long**, a three-message chat prompt of 4,000 characters (15 blocks), the
same for every request, with the index warm (its blocks held by one endpoint, so the rule
sticks); **short**, the latency scenario's (``bench/scenarios/latency.toml``: unique prompts,
median ~67 tokens): one user message of 270 characters (one block), a different one per
request, so nothing matches and the rule routes by load.

``--dispatch N`` also times the dispatcher's fast path over the router's placement (as
``bench.placement_micro``: ``PoolDispatcher`` over ``FleetPlacement``, 2 endpoints of 64 slots,
32 in flight) with the router's placer, for ``N`` tickets without a prefix and ``N`` with a
unique one-block prefix each (its ``prefix_started`` release included): the placement's share
of prefix routing as the request path runs it, best of three.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import time
from collections.abc import Sequence
from typing import cast

import msgspec

from bench.stage_context import chat_context, cpu_us_per_call
from runtime.admission.redis_limits import RedisLimits
from runtime.gateway.bundles import AdmissionDeps, PriceHolder
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.pipeline.stages.prefix import PrefixBlocks, PrefixStarted
from runtime.routing.inflight import InFlight
from runtime.routing.kv_index import EventedPrefixIndex
from runtime.routing.prefix import PromptPrefix, block_hashes, estimate_tokens, render_chat
from runtime.routing.prefix_placer import PrefixPlacer
from runtime.routing.signals import FleetSignals
from runtime.routing.table import RoutingTable
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Grant, Ticket
from runtime.scheduling.placement import FleetPlacement
from runtime.scheduling.pools import Dispatchers
from runtime.scheduling.settings import PoolSettings
from runtime.snapshot import Snapshot
from runtime.telemetry.metrics import RouterMetrics
from runtime.testing.fleet import HandFleet
from runtime.testing.snapshots import SnapshotBuilder, endpoint_snap
from runtime.upstream.breaker import BreakerBook
from runtime.upstream.client import UpstreamClient
from runtime.upstream.health import HealthMonitor

MODEL = "tiny"
MESSAGES = [
    {"role": "system", "content": "s" * 3000},
    {"role": "user", "content": "u" * 500},
    {"role": "assistant", "content": "a" * 500},
]


def _snapshot(policies: dict[str, str]) -> Snapshot:
    world = SnapshotBuilder()
    world.add_tenant("acme")
    world.add_key("k", "acme")
    world.add_model(MODEL, 1)
    world.add_endpoint(1, 1, pool="gpu")
    world.pools["gpu"] = msgspec.structs.replace(world.pools["gpu"], policies=policies)
    return world.snapshot()


def _context(snapshot: Snapshot, body: bytes) -> RequestContext:
    return chat_context(snapshot, body, model=MODEL, prompt_tokens=1000)


def release_us(contexts: Sequence[RequestContext]) -> float:
    """CPU microseconds per request of the releases the stage registered (the pipeline runs
    them at the request's end), the loop's own cost included."""

    async def run() -> float:
        gc.collect()
        gc.disable()  # as cpu_us_per_call: the contexts built for the run are not ours
        try:
            start = time.process_time()
            for ctx in contexts:
                await ctx.exits.aclose()
            return (time.process_time() - start) / len(contexts) * 1e6
        finally:
            gc.enable()

    return asyncio.run(run())


def short_bodies(count: int, chars: int = 270) -> list[bytes]:
    """``count`` unique one-message chat bodies of ``chars`` characters (the latency scenario's
    unique prompt: its index, then filler, as :func:`bench.workload.prompt_text`)."""
    out = []
    for n in range(count):
        text = (f"r{n} " + "lorem ipsum dolor sit amet " * (chars // 27 + 1))[:chars]
        messages = [{"role": "user", "content": text}]
        out.append(msgspec.json.encode({"model": MODEL, "messages": messages, "stream": True}))
    return out


def measure(iterations: int, endpoints: int = 4, *, short: bool = False) -> dict[str, float]:
    """The stages', the placer's and ``prefix_started``'s CPU µs per request, and the blocks."""
    found = measure_all(iterations, endpoints, short=short)
    return {key: found[key] for key in ("stage_off_us", "stage_on_us", "placer_us",
                                        "started_us", "blocks")}  # fmt: skip


def measure_all(iterations: int, endpoints: int = 4, *, short: bool = False) -> dict[str, float]:
    """:func:`measure`'s figures and the request-end releases', on and off."""
    table = RoutingTable()
    fleet = HandFleet()
    admission = AdmissionDeps(
        limits=cast(RedisLimits, None),  # the stages never read the tenant limits
        dispatchers=Dispatchers(placement_for=lambda pool: fleet, tick_s=0.05), table=table,
        prices=PriceHolder(), metrics=RouterMetrics(), default_band=1,
        prefix=PrefixPlacer(index=EventedPrefixIndex()),  # as the router builds it
    )  # fmt: skip
    blocks, started = PrefixBlocks(admission), PrefixStarted(admission)
    if short:
        bodies = short_bodies(iterations)
    else:
        body = msgspec.json.encode({"model": MODEL, "messages": MESSAGES, "stream": True})
        bodies = [body] * iterations
    off, on = _snapshot({"prefix_routing": "off"}), _snapshot({})
    unplanned = [_context(off, b) for b in bodies]
    off_us = cpu_us_per_call(blocks, unplanned)
    planned = [_context(on, b) for b in bodies]
    on_us = cpu_us_per_call(blocks, planned)
    prefixes = [ctx.ready_plan.prefix for ctx in planned]
    assert all(isinstance(p, PromptPrefix) for p in prefixes)
    placer = admission.prefix
    eps = [endpoint_snap(i, capacity=8) for i in range(1, endpoints + 1)]
    first = cast(PromptPrefix, prefixes[0])
    if not short:  # warm: one endpoint holds the prompt, so the rule sticks
        placer.sent(1, first, placer.match(first, eps))
        placer.started(first)
    start = time.process_time()
    stuck = 0
    for prefix in prefixes:
        assert prefix is not None
        match = placer.match(prefix, eps)
        chosen = placer.sticky(eps, match, lambda _: 1) or eps[-1]
        stuck += chosen.id == 1
        placer.sent(chosen.id, prefix, match)
        placer.started(prefix)
    place_us = (time.process_time() - start) / iterations * 1e6
    if stuck != (0 if short else iterations):
        raise AssertionError(f"the rule stuck {stuck} of {iterations} times")
    started_us = cpu_us_per_call(started, planned)
    return {"stage_off_us": off_us, "stage_on_us": on_us, "placer_us": place_us,
            "started_us": started_us, "release_us": release_us(planned),
            "release_off_us": release_us(unplanned),
            "blocks": float(len(first.hashes))}  # fmt: skip


async def dispatch_us(requests: int, *, prefix: bool, window: int = 32) -> float:
    """CPU µs per acquire + release (best of 3) of tickets with a unique one-block prefix
    each, or none (see the module docstring)."""
    loop = asyncio.get_running_loop()
    builder = SnapshotBuilder().add_model("m", 1)
    for endpoint_id in (1, 2):
        builder.add_endpoint(endpoint_id, 1, pool="p", capacity=64)
    snapshot = builder.snapshot()
    health = HealthMonitor(UpstreamClient())
    health.set_endpoints(snapshot.endpoints.values())
    inflight = InFlight()
    placer = PrefixPlacer(index=EventedPrefixIndex())
    placement = FleetPlacement(
        "p", snapshot=lambda: snapshot, table=RoutingTable(), health=health, inflight=inflight,
        signals=FleetSignals(breakers=BreakerBook(), health=health, inflight=inflight),
        clock=loop.time, on_slot=lambda endpoint_id, delta: None, prefix=placer,
    )  # fmt: skip
    dispatcher = PoolDispatcher("p", PoolSettings(), placement, clock=loop.time)
    dispatcher.start()
    best = float("inf")
    try:
        for repeat in range(3):
            tickets = [
                Ticket(tenant=f"t{i % 4}", version=1, input_tokens=10, max_output_tokens=10,
                       band=0, class_name="standard", shed_order=0, weight=1.0,
                       deadline=loop.time() + 3600,
                       prefix=_unique_prefix(f"{repeat}-{i}") if prefix else None)
                for i in range(requests)
            ]  # fmt: skip
            start = time.process_time()
            held: list[Grant] = []
            for ticket in tickets:
                held.append(await dispatcher.acquire(ticket))
                if len(held) > window:
                    _release_grant(held.pop(0), placer)
            for grant in held:
                _release_grant(grant, placer)
            best = min(best, time.process_time() - start)
    finally:
        await dispatcher.stop()
    return best / requests * 1e6


def _unique_prefix(name: str) -> PromptPrefix:
    text = render_chat([("user", (f"r{name} " + "lorem ipsum dolor sit amet " * 11)[:270])])
    return PromptPrefix(hashes=block_hashes(text), prompt_tokens=estimate_tokens(text))


def _release_grant(grant: Grant, placer: PrefixPlacer) -> None:
    if grant.ticket.prefix is not None:
        placer.started(grant.ticket.prefix)  # the prefix_started stage
    grant.release()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=5_000)
    parser.add_argument("--endpoints", type=int, default=4)
    parser.add_argument(
        "--dispatch",
        type=int,
        default=0,
        metavar="N",
        help="also time the dispatcher's fast path, N tickets (0: not)",
    )
    args = parser.parse_args(argv)
    for short in (False, True):
        m = measure_all(args.iterations, args.endpoints, short=short)
        what = "270-character unique prompt" if short else "4,000-character chat prompt"
        print(f"prefix routing, {what} ({m['blocks']:.0f} blocks), "
              f"{args.endpoints} endpoints (CPU per request)")  # fmt: skip
        print(f"  prefix stage, pool policy off:      {m['stage_off_us']:7.2f} us")
        print(f"  prefix stage, on (hash the prompt): {m['stage_on_us']:7.2f} us")
        print(f"  placer: match, rule, record, done:  {m['placer_us']:7.2f} us")
        print(f"  prefix_started stage:               {m['started_us']:7.2f} us")
        print(
            f"  request-end releases, on (off):     {m['release_us']:7.2f} us"
            f" ({m['release_off_us']:.2f} us)"
        )
    if args.dispatch:
        none = asyncio.run(dispatch_us(args.dispatch, prefix=False))
        unique = asyncio.run(dispatch_us(args.dispatch, prefix=True))
        print(
            "dispatcher acquire + release over FleetPlacement, 2 endpoints: no prefix "
            f"{none:.2f} us, a unique one-block prefix {unique:.2f} us (+{unique - none:.2f})"
        )


if __name__ == "__main__":
    main()
