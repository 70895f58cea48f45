"""The router's CPU with prefix-aware routing on and off: idle, and at a light load (issue #35).

``python -m bench.prefix_cpu [--scenario bench/scenarios/latency.toml] [--phase unloaded]
[--rounds 3] [--seconds 10] [--idle-seconds 10] [--fresh] [--twin] [--off-first] [--pin]
[--profile DIR] [--redis-url URL]`` starts the scenario's
backends and two routers in front of them at once: ``switchyard`` (the defaults: prefix-aware
routing on) and ``switchyard-load-only`` (pool policy ``prefix_routing: off``); nothing else
differs. Then, ``rounds`` times:

- **idle**: no request for ``idle-seconds``; both routers' CPU seconds over the same window
  (so the machine's load hits both alike): what runs without traffic (timers, sweeps,
  pollers) and whether it runs only with prefix routing on;
- **loaded**: the phase's schedule (``phase``, cut to ``seconds``) played through one router,
  then the other (the order alternates from round to round), from idle backends; each
  router's CPU per request over its own window, and its requests' TTFT p50. Every round
  replays the same schedule, so from the second round on the prefix-aware router's index
  holds every prompt's blocks (they match, and the sticky rule places them); ``--fresh``
  plays a schedule of its own in each round with prompts no earlier round sent
  (:func:`fresh_plan`), as in the harness's first phase, both routers the same one.

It prints one line per round and measurement, with the ratio on / off, then the ratios'
mean and spread (min-max). On a loaded machine only the ratios within a round mean much.

``--twin`` makes the second router prefix-aware as well (an A/A check of the rig: its
ratios should be 1 within the machine's noise); ``--off-first`` starts the load-only router
first (the routers' start order is the rig's other asymmetry); ``--pin`` pins as ``bench run``
does: both routers to the last core (one plays at a time), this process and the backends to
the others.

``--profile DIR`` runs both routers under cProfile (:mod:`bench.profiled_router`), on only
during the loaded plays, writes their stats to ``DIR/<target>.prof`` and prints the
functions whose own time per request differs most between the two (on minus off): what
runs per request only with prefix routing on. cProfile inflates every call, so read the CPU
lines of such a run as profiled, and the difference's rows for where it goes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import pstats
import signal
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
from bench.procs import CpuSampler, router_cpus
from bench.runner import DEFAULT_REDIS_URL, client_cpus, new_key, request_headers
from bench.scenario import PhaseSpec, Scenario, load
from bench.targets import FACTORIES, Target, TargetContext
from bench.targets.switchyard import SwitchyardTarget
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


def _signal(target: Target, signum: int) -> None:
    """Switch a profiled router's cProfile on (SIGUSR1) or off (SIGUSR2, stats written)."""
    if isinstance(target, SwitchyardTarget) and target.profile is not None:
        for pid in target.pids():
            os.kill(pid, signum)


async def _written(path: Path) -> None:
    for _ in range(100):  # written whole, then renamed into place
        if await asyncio.to_thread(path.exists):
            return
        await asyncio.sleep(0.1)


def own_time(path: Path) -> dict[str, float]:
    """Own seconds per function (``module:line(name)``) in a cProfile stats file."""
    stats = pstats.Stats(str(path))
    out: dict[str, float] = {}
    for (file, line, name), row in stats.stats.items():  # type: ignore[attr-defined]
        where = f"{'/'.join(file.rsplit('/', 2)[-2:])}:{line}({name})"
        out[where] = out.get(where, 0.0) + row[2]
    return out


def profile_diff(on: dict[str, float], off: dict[str, float], on_n: int, off_n: int,
                 top: int = 25) -> list[str]:  # fmt: skip
    """The ``top`` functions whose own µs per request differ most (on minus off)."""
    rows = []
    for where in on.keys() | off.keys():
        a, b = 1e6 * on.get(where, 0.0) / on_n, 1e6 * off.get(where, 0.0) / off_n
        rows.append((a - b, a, b, where))
    rows.sort(key=lambda r: -abs(r[0]))
    total = (1e6 * sum(on.values()) / on_n, 1e6 * sum(off.values()) / off_n)
    lines = [f"profiled own time per request: on {total[0]:.0f} us, off {total[1]:.0f} us",
             f"{'on-off us':>9} {'on us':>8} {'off us':>8}  function"]  # fmt: skip
    lines += [f"{d:9.1f} {a:8.1f} {b:8.1f}  {w}" for d, a, b, w in rows[:top]]
    return lines


async def _loaded(
    target: Target, plan: PhasePlan, scenario: Scenario, session: aiohttp.ClientSession,
    keys: dict[str, str],
) -> tuple[float, float, int]:  # fmt: skip
    """CPU ms per request, TTFT p50 ms and requests of one play of ``plan`` through
    ``target`` (profiled over the play when the target is)."""
    _signal(target, signal.SIGUSR1)
    stop = asyncio.Event()
    sampling = asyncio.create_task(CpuSampler(target.pids()).run(stop))
    run = await run_phase(
        session, plan, base_urls=target.base_urls, headers_for=request_headers(keys, None),
        model=scenario.backends.model, timeout_s=30.0, drain_timeout_s=10.0,
    )  # fmt: skip
    stop.set()
    usage = await sampling
    if isinstance(target, SwitchyardTarget) and target.profile is not None:
        await asyncio.to_thread(target.profile.unlink, missing_ok=True)
        _signal(target, signal.SIGUSR2)
        await _written(target.profile)
    ttfts = sorted(r.ttft for r in run.results if r.ttft is not None)
    p50 = percentile(ttfts, 50) or 0.0
    n = len(run.results)
    return 1000.0 * usage.cpu_s / max(n, 1), 1000.0 * p50, n


def _summary(label: str, ratios: list[float]) -> str:
    return (
        f"{label}: on/off mean {statistics.mean(ratios):.3f}, "
        f"min {min(ratios):.3f}, max {max(ratios):.3f} ({len(ratios)} rounds)"
    )


def fresh_plan(scenario: Scenario, phase: PhaseSpec, seconds: float, round_: int) -> PhasePlan:
    """Round ``round_``'s schedule with ``--fresh``: drawn from the scenario's seed plus the
    round, its requests' indices moved past every earlier round's. A unique prompt's text is
    its index and a fixed filler (:func:`bench.workload.prompt_text`), so without the move the
    first blocks of request ``k`` would repeat those of request ``k`` of every earlier round."""
    drawn = dataclasses.replace(scenario, seed=scenario.seed + round_)
    plan = plan_phase(drawn, phase, duration_s=seconds, max_requests=100_000)
    offset = round_ * 1_000_000
    moved = tuple(dataclasses.replace(p, index=p.index + offset) for p in plan.requests)
    return dataclasses.replace(plan, requests=moved)


def _targets(args: argparse.Namespace) -> list[Target]:
    """The two routers, not started: prefix routing on and off (``--twin``: on twice), under
    cProfile with ``--profile``."""
    out: list[Target] = []
    for name in (ON, OFF):
        target = FACTORIES[name]()
        if args.twin and name == OFF:  # the A/A check: the same router twice
            target = dataclasses.replace(FACTORIES[ON](), name=OFF)
        if args.profile is not None and isinstance(target, SwitchyardTarget):
            args.profile.mkdir(parents=True, exist_ok=True)
            target = dataclasses.replace(target, profile=(args.profile / f"{name}.prof").resolve())
        out.append(target)
    return out[::-1] if args.off_first else out


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
            routers = router_cpus() if args.pin else ()
            clients = client_cpus(routers) if routers else ()
            if clients:  # as `bench run`: the routers get the last core, the rest the others
                os.sched_setaffinity(0, clients)
            backends = await start_backends(
                scenario.backends, session=session, log_dir=work, cpus=clients, timeout_s=60.0
            )
            ctx = TargetContext(
                scenario=scenario, backend_urls=[b.base_url for b in backends],
                work_dir=work, redis_url=args.redis_url, run_id=uuid.uuid4().hex[:12],
                router_cpus=routers, session=session, keys=keys, pki=pki,
            )  # fmt: skip
            for target in _targets(args):
                targets.append(target)
                await target.start(ctx)
            print(f"{scenario.name}/{phase.name}: {len(plan.requests)} requests in "
                  f"{args.seconds:g} s per play; idle windows {args.idle_seconds:g} s"
                  + ("; --twin: 'off' is prefix-aware too" if args.twin else ""))  # fmt: skip
            idle, cpu, ttft = [], [], []
            played = {ON: 0, OFF: 0}
            for round_ in range(args.rounds):
                if args.fresh and round_ > 0:  # another schedule: prompts the index never saw
                    plan = fresh_plan(scenario, phase, args.seconds, round_)
                on_s, off_s = await _cpu_over(targets, args.idle_seconds)
                idle.append(on_s / off_s if off_s > 0 else float("nan"))
                print(f"round {round_ + 1} idle: on {1000 * on_s / args.idle_seconds:.2f} "
                      f"ms/s, off {1000 * off_s / args.idle_seconds:.2f} ms/s")  # fmt: skip
                order = targets if round_ % 2 == 0 else targets[::-1]
                loaded: dict[str, tuple[float, float, int]] = {}
                for target in order:
                    await wait_idle(backends, session, timeout_s=10.0)
                    loaded[target.name] = await _loaded(target, plan, scenario, session, keys)
                    played[target.name] += loaded[target.name][2]
                (on_cpu, on_ttft, _), (off_cpu, off_ttft, _) = loaded[ON], loaded[OFF]
                cpu.append(on_cpu / off_cpu)
                ttft.append(on_ttft / off_ttft)
                print(f"round {round_ + 1} loaded ({order[0].name} first): CPU per request "
                      f"on {on_cpu:.3f} ms, off {off_cpu:.3f} ms; TTFT p50 on "
                      f"{on_ttft:.2f} ms, off {off_ttft:.2f} ms")  # fmt: skip
            print(_summary("idle CPU", idle))
            print(_summary("CPU per request", cpu))
            print(_summary("TTFT p50", ttft))
            if args.profile is not None:
                stats = {n: args.profile / f"{n}.prof" for n in (ON, OFF)}
                print("\n".join(profile_diff(own_time(stats[ON]), own_time(stats[OFF]),
                                             max(played[ON], 1), max(played[OFF], 1))))  # fmt: skip
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
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        metavar="DIR",
        help="run both routers under cProfile; stats and their difference",
    )
    parser.add_argument(
        "--fresh", action="store_true",
        help="each round plays a schedule of its own (seed + round), as the harness's phases "
        "do, instead of replaying the first round's prompts to routers that indexed them",
    )  # fmt: skip
    parser.add_argument(
        "--off-first", action="store_true",
        help="start the load-only router first (and play it first in odd rounds)",
    )  # fmt: skip
    parser.add_argument(
        "--twin", action="store_true",
        help="an A/A check: the second router is prefix-aware too, so a ratio away from 1 is "
        "the rig's own (which router started first, its ports, the machine)",
    )  # fmt: skip
    parser.add_argument("--pin", action="store_true",
                        help="pin both routers to the last core, this process and the "
                        "backends to the others (as `bench run` does)")  # fmt: skip
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL))
    started = time.monotonic()
    asyncio.run(measure(parser.parse_args(argv)))
    print(f"({time.monotonic() - started:.0f} s)")


if __name__ == "__main__":
    main()
