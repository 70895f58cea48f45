"""The router's CPU with prefix-aware routing on and off: idle, and at a light load (issue #35).

``python -m bench.prefix_cpu [--scenario bench/scenarios/latency.toml] [--phase unloaded]
[--rounds 3] [--seconds 10] [--idle-seconds 10] [--redis-url URL]`` starts the scenario's
backends and two routers in front of them at once: ``switchyard`` (the defaults: prefix-aware
routing on) and ``switchyard-load-only`` (pool policy ``prefix_routing: off``); nothing else
differs. Then, ``rounds`` times:

- **idle**: no request for ``idle-seconds``; both routers' CPU seconds over the same window
  (so the machine's load hits both alike): what runs without traffic (timers, sweeps,
  pollers) and whether it runs only with prefix routing on;
- **loaded**: the phase's schedule (``phase``, cut to ``seconds``) played through one router,
  then the other (the order alternates from round to round), from idle backends; each
  router's CPU per request over its own window, and its requests' TTFT p50.

It prints one line per round and measurement, with the ratio on / off, then the ratios'
mean and spread (min-max). On a loaded machine only the ratios within a round mean much.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from tempfile import TemporaryDirectory

import aiohttp

from bench.backends import start_backends, wait_idle
from bench.loadgen import run_phase
from bench.metrics import percentile
from bench.procs import CpuSampler
from bench.runner import DEFAULT_REDIS_URL, new_key, request_headers
from bench.scenario import Scenario, load
from bench.targets import FACTORIES, Target, TargetContext
from bench.workload import PhasePlan, plan_phase
from config.tls import ensure_local_pki
from runtime.tls import ClientTLS

ON, OFF = "switchyard", "switchyard-load-only"


async def _cpu_over(targets: Sequence[Target], seconds: float) -> list[float]:
    """CPU seconds of each target over the same ``seconds`` of wall time."""
    stop = asyncio.Event()
    samplers = [asyncio.create_task(CpuSampler(t.pids()).run(stop)) for t in targets]
    await asyncio.sleep(seconds)
    stop.set()
    return [(await s).cpu_s for s in samplers]


async def _loaded(
    target: Target, plan: PhasePlan, scenario: Scenario, session: aiohttp.ClientSession,
    keys: dict[str, str],
) -> tuple[float, float]:  # fmt: skip
    """CPU ms per request and TTFT p50 ms of one play of ``plan`` through ``target``."""
    stop = asyncio.Event()
    sampling = asyncio.create_task(CpuSampler(target.pids()).run(stop))
    run = await run_phase(
        session, plan, base_urls=target.base_urls, headers_for=request_headers(keys, None),
        model=scenario.backends.model, timeout_s=30.0, drain_timeout_s=10.0,
    )  # fmt: skip
    stop.set()
    usage = await sampling
    ttfts = sorted(r.ttft for r in run.results if r.ttft is not None)
    p50 = percentile(ttfts, 50) or 0.0
    return 1000.0 * usage.cpu_s / max(len(run.results), 1), 1000.0 * p50


def _summary(label: str, ratios: list[float]) -> str:
    return (
        f"{label}: on/off mean {statistics.mean(ratios):.3f}, "
        f"min {min(ratios):.3f}, max {max(ratios):.3f} ({len(ratios)} rounds)"
    )


async def measure(args: argparse.Namespace) -> None:
    scenario = load(args.scenario)
    phase = next(p for p in scenario.phases if p.name == args.phase)
    plan = plan_phase(scenario, phase, duration_s=args.seconds, max_requests=100_000)
    keys = {t.name: new_key() for t in scenario.tenants}
    with TemporaryDirectory(prefix="prefix-cpu-") as tmp:
        work = Path(tmp)
        pki, _ = ensure_local_pki(work)
        connector = aiohttp.TCPConnector(limit=0, ssl=ClientTLS(ca=pki.ca).context())
        session = aiohttp.ClientSession(connector=connector)
        backends, targets = [], []
        try:
            backends = await start_backends(
                scenario.backends, session=session, log_dir=work, cpus=(), timeout_s=60.0
            )
            ctx = TargetContext(
                scenario=scenario, backend_urls=[b.base_url for b in backends],
                work_dir=work, redis_url=args.redis_url, run_id=uuid.uuid4().hex[:12],
                router_cpus=(), session=session, keys=keys, pki=pki,
            )  # fmt: skip
            for name in (ON, OFF):
                target = FACTORIES[name]()
                targets.append(target)
                await target.start(ctx)
            print(f"{scenario.name}/{phase.name}: {len(plan.requests)} requests in "
                  f"{args.seconds:g} s per play; idle windows {args.idle_seconds:g} s")  # fmt: skip
            idle, cpu, ttft = [], [], []
            for round_ in range(args.rounds):
                on_s, off_s = await _cpu_over(targets, args.idle_seconds)
                idle.append(on_s / off_s if off_s > 0 else float("nan"))
                print(f"round {round_ + 1} idle: on {1000 * on_s / args.idle_seconds:.2f} "
                      f"ms/s, off {1000 * off_s / args.idle_seconds:.2f} ms/s")  # fmt: skip
                order = targets if round_ % 2 == 0 else targets[::-1]
                loaded: dict[str, tuple[float, float]] = {}
                for target in order:
                    await wait_idle(backends, session, timeout_s=10.0)
                    loaded[target.name] = await _loaded(target, plan, scenario, session, keys)
                (on_cpu, on_ttft), (off_cpu, off_ttft) = loaded[ON], loaded[OFF]
                cpu.append(on_cpu / off_cpu)
                ttft.append(on_ttft / off_ttft)
                print(f"round {round_ + 1} loaded ({order[0].name} first): CPU per request "
                      f"on {on_cpu:.3f} ms, off {off_cpu:.3f} ms; TTFT p50 on "
                      f"{on_ttft:.2f} ms, off {off_ttft:.2f} ms")  # fmt: skip
            print(_summary("idle CPU", idle))
            print(_summary("CPU per request", cpu))
            print(_summary("TTFT p50", ttft))
        finally:
            for target in targets:
                await target.stop()
            for child in backends:
                await asyncio.to_thread(child.stop)
            await session.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.prefix_cpu")
    parser.add_argument("--scenario", type=Path, default=Path("bench/scenarios/latency.toml"))
    parser.add_argument("--phase", default="unloaded")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--idle-seconds", type=float, default=10.0)
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    started = time.monotonic()
    asyncio.run(measure(parser.parse_args(argv)))
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
