"""CPU cost of the ``degrade`` stage and of model-alias resolution, per request.

``python -m bench.degrade_micro [--iterations 20000]`` measures with ``time.process_time``
(CPU, not wall) over many iterations, on a snapshot of three chat models in two pools:

- ``off``: the stage on a pool without a degradation policy (the default): the per-pool
  settings lookup, then nothing;
- ``calm``: the stage with ``cap_tokens`` configured on a calm pool (the queue-wait reading,
  the endpoint filters, the policy's decision: nothing to do);
- ``capped``: the same while a request waits in the queue: ``max_tokens`` capped and the
  upstream body encoded again;
- ``alias``: resolving a three-member alias (the route's version of each member, the
  capability and context checks, the price lookup), which the ``plan`` stage adds for a
  request that names an alias.

A fallback plans the request a second time (about the ``plan`` stage's own cost); it is not
measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, cast

import msgspec

from runtime.admission.redis_limits import RedisLimits
from runtime.gateway.aliases import resolve_alias
from runtime.gateway.bundles import AdmissionDeps, PlanningDeps, PriceHolder
from runtime.gateway.config import RouterConfig
from runtime.gateway.inference import ChatCompletionsConsumer
from runtime.gateway.key_usage import KeyUsageRecorder
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.pipeline.stages.degrade import Degrade
from runtime.gateway.plan import Plan
from runtime.gateway.schema import decode_request
from runtime.gateway.tokens import TokenCounter
from runtime.routing.table import RoutingTable
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Ticket
from runtime.scheduling.pools import Dispatchers
from runtime.snapshot import Snapshot
from runtime.telemetry.logging import RequestRecord
from runtime.telemetry.metrics import RouterMetrics
from runtime.testing.fleet import HandFleet
from runtime.testing.snapshots import SnapshotBuilder
from runtime.upstream.breaker import BreakerBook

PROMPT = "Summarise the quarterly report " * 8
BODY = {"model": "big", "max_tokens": 200, "stream": True,
        "messages": [{"role": "user", "content": PROMPT}]}  # fmt: skip


class _Sink:
    async def start_response(self, status: int, headers: Any) -> None:
        return None

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        return None


def world() -> SnapshotBuilder:
    built = SnapshotBuilder().add_class("interactive", band=0).add_tenant("acme")
    built.add_model("big", 1, max_context=8192, capabilities=("tools",), fallback="small")
    built.add_model("mid", 2, max_context=4096, capabilities=("json_output",))
    built.add_model("small", 3, max_context=1024)
    degrade = {"degrade": "cap_tokens", "degrade_wait_ms": "1"}
    built.add_pool("gpu", hardware_tier="gpu", policies=degrade)
    built.add_endpoint(1, 1, pool="gpu", capacity=1)
    built.add_endpoint(2, 2, pool="cpu")
    built.add_endpoint(3, 3, pool="cpu")
    for version, price in ((1, 6.0), (2, 2.0), (3, 0.5)):
        tier = "gpu" if version == 1 else "cpu"
        built.add_price(version, input_per_1k=price, output_per_1k=price, hardware_tier=tier)
    return built.add_alias("family", ("big", "mid", "small"))


async def cpu_us(step: Callable[[], Awaitable[object]], iterations: int) -> float:
    """CPU microseconds per awaited call of ``step``."""
    await step()
    start = time.process_time()
    for _ in range(iterations):
        await step()
    return (time.process_time() - start) / iterations * 1e6


async def measure(iterations: int) -> dict[str, float]:
    loop = asyncio.get_running_loop()
    table = RoutingTable()
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    dispatchers = Dispatchers(placement_for=lambda pool: fleet, tick_s=0.05)
    metrics = RouterMetrics()
    admission = AdmissionDeps(
        limits=cast(RedisLimits, None),  # the stage never reads the tenant limits
        dispatchers=dispatchers, table=table, prices=PriceHolder(), metrics=metrics,
        default_band=1,
    )  # fmt: skip
    planning = PlanningDeps(
        config=RouterConfig(), tokens=TokenCounter(), table=table, rng=random.Random(1),
        key_usage=KeyUsageRecorder("redis://127.0.0.1:1/0", hash_key="unused"),
    )  # fmt: skip
    stage = Degrade(planning, admission, BreakerBook())
    built = world()
    on = built.snapshot()
    built.pools["gpu"] = msgspec.structs.replace(built.pools["gpu"], policies={})
    off = built.snapshot()
    spec = ChatCompletionsConsumer.spec
    body = msgspec.json.encode(BODY)

    def context(snapshot: Snapshot) -> RequestContext:
        record = RequestRecord(request_id="r", route=spec.route)
        ctx = RequestContext(
            spec=spec, request_id="r", body=body, headers=lambda _: None, raw_headers=(),
            client=_Sink(), cut=lambda: None, record=record,
        )  # fmt: skip
        ctx.snapshot = snapshot
        ctx.request = decode_request(body, spec.decoder)
        ctx.plan = Plan(
            model=snapshot.models["big"], version=snapshot.versions[1],
            klass=snapshot.classes["interactive"], deadline=loop.time() + 60, streaming=True,
            include_usage=True, body=body, prompt_tokens=80, max_tokens=200,
        )  # fmt: skip
        return ctx

    def step(snapshot: Snapshot) -> tuple[Callable[[], Awaitable[None]], RequestContext]:
        ctx = context(snapshot)
        assert ctx.request is not None
        assert ctx.plan is not None
        document, plan = ctx.request.document, ctx.plan

        async def run() -> None:
            document["max_tokens"] = 200
            plan.max_tokens = 200
            ctx.response_headers.clear()
            await stage(ctx)

        return run, ctx

    result = {"off_us": await cpu_us(step(off)[0], iterations),
              "calm_us": await cpu_us(step(on)[0], iterations)}  # fmt: skip
    result["capped_us"] = await _while_queued(dispatchers.get(on, "gpu"), *step(on), iterations)

    alias = on.aliases["family"]
    request = decode_request(body, spec.decoder)
    texts = [PROMPT]

    async def resolve() -> None:
        await resolve_alias(
            on, alias, tenant=on.tenants["acme"], document=request.document, texts=texts,
            overheads=[0] * len(texts), max_tokens=200, tokens=planning.tokens, table=table,
            rng=planning.rng, user=None, headers=(),
        )  # fmt: skip

    result["alias_us"] = await cpu_us(resolve, iterations)
    return result


async def _while_queued(
    dispatcher: PoolDispatcher,
    capped: Callable[[], Awaitable[None]],
    ctx: RequestContext,
    iterations: int,
) -> float:
    """The stage's CPU while a request waits in the pool's queue (so it caps)."""
    loop = asyncio.get_running_loop()
    dispatcher.start()
    ticket = Ticket(tenant="acme", version=1, input_tokens=10, max_output_tokens=10, band=0,
                    class_name="interactive", shed_order=0, weight=1.0,
                    deadline=loop.time() + 3600)  # fmt: skip
    held = await dispatcher.acquire(ticket)
    waiting = asyncio.ensure_future(dispatcher.acquire(ticket))
    await asyncio.sleep(0.01)  # the second ticket is queued, past the 1 ms threshold
    try:
        await capped()
        assert ctx.response_headers == [(b"x-switchyard-degraded", b"max_tokens=128")]
        return await cpu_us(capped, iterations)
    finally:
        waiting.cancel()
        held.release()
        await dispatcher.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=20_000)
    args = parser.parse_args(argv)
    for name, value in asyncio.run(measure(args.iterations)).items():
        print(f"{name:>10}: {value:6.2f} us CPU per request")


if __name__ == "__main__":
    main()
