"""Where a request's router CPU goes (issue #27): the real router under cProfile.

``python -m bench.request_profile [--rate 100] [--seconds 10] [--out FILE] [--top 30]
[--baseline DIR]`` starts the ``latency`` scenario's simulator backends and the harness's
``switchyard`` target (one worker, pinned like the harness pins it) with the router running
under cProfile; sends ``rate`` streamed chat completions per second for ``seconds``
(:func:`bench.tls_micro.paced`: the router's CPU per request from ``/proc``) with the profiler
on for that window only (:mod:`bench.profiled_router`), and prints the functions with the most
own time, per request. cProfile slows what it measures (a
call costs more under it), so its CPU per request is higher than unprofiled; the shares are
what to read. ``--baseline DIR`` profiles the checkout at ``DIR`` the same way, after ours.

Needs Redis (``REDIS_URL``), like the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import signal
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.backends import start_backends
from bench.procs import Child, router_cpus
from bench.runner import DEFAULT_REDIS_URL, client_cpus, new_key
from bench.scenario import Scenario, load
from bench.targets import TargetContext
from bench.targets.switchyard import SwitchyardTarget
from bench.tls_micro import SCENARIO, paced


@dataclass
class Rig:
    """What a bench over the latency scenario's simulators holds: the load generator pinned
    off the routers' core, its session, one key per tenant, the backends once started."""

    scenario: Scenario
    work: Path
    routers: tuple[int, ...]
    session: aiohttp.ClientSession
    keys: dict[str, str]
    backends: list[Child] = field(default_factory=list)


def rig(prefix: str) -> Rig:
    """A :class:`Rig` in a fresh work directory (call it in the running event loop)."""
    scenario = load(SCENARIO)
    work = Path(tempfile.mkdtemp(prefix=prefix))
    (work / "logs").mkdir()
    routers = router_cpus()
    if routers:
        os.sched_setaffinity(0, client_cpus(routers))
    session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
    return Rig(scenario, work, routers, session, {t.name: new_key() for t in scenario.tenants})


async def start_simulators(bench: Rig) -> TargetContext:
    """The scenario's simulator backends (in ``bench.backends`` as they start, for the caller
    to stop) off the routers' core, and the context a target starts in."""
    routers, work = bench.routers, bench.work
    bench.backends += await start_backends(
        bench.scenario.backends, session=bench.session, log_dir=work / "logs",
        cpus=client_cpus(routers) if routers else (), timeout_s=60.0,
    )  # fmt: skip
    return TargetContext(
        scenario=bench.scenario, backend_urls=[b.base_url for b in bench.backends],
        work_dir=work / "logs", redis_url=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL),
        run_id=uuid.uuid4().hex[:8], router_cpus=routers, session=bench.session,
        keys=bench.keys, pki=None, backend_cpus=client_cpus(routers) if routers else (),
    )  # fmt: skip


async def profile(
    args: argparse.Namespace, source: Path | None, out: Path, runner: str = "bench.profiled_router"
) -> dict[str, Any]:
    """The paced window under ``runner`` (a wrapper switched on by SIGUSR1 and off by
    SIGUSR2, writing ``out``: :mod:`bench.profiled_router`, :mod:`bench.gc_router`)."""
    bench = rig("switchyard-request-profile-")
    scenario, session, keys = bench.scenario, bench.session, bench.keys
    target = SwitchyardTarget(name="switchyard", source=source, profile=out, runner=runner)
    await asyncio.to_thread(out.unlink, missing_ok=True)
    try:
        ctx = await start_simulators(bench)
        await target.start(ctx)
        key = next(iter(keys.values()))
        model = scenario.backends.model
        await paced(target, session, key=key, model=model, rate=args.rate, seconds=1.0)  # warm
        [pid] = target.pids()
        os.kill(pid, signal.SIGUSR1)  # bench.profiled_router: profile from here
        result = await paced(target, session, key=key, model=model, rate=args.rate,
                             seconds=args.seconds)  # fmt: skip
        os.kill(pid, signal.SIGUSR2)  # to here; the stats are written
        for _ in range(100):  # written whole, then renamed into place
            if await asyncio.to_thread(out.exists):
                break
            await asyncio.sleep(0.1)
        return result
    finally:
        await target.stop()
        for child in bench.backends:
            await asyncio.to_thread(child.stop)
        await session.close()


def report(out: Path, requests: int, top: int) -> None:
    stats = pstats.Stats(str(out))
    rows: list[tuple[float, float, int, str]] = []
    for (path, line, name), (_cc, calls, own, cumulative, _callers) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((own, cumulative, calls, f"{path.rsplit('/', 2)[-2:]}:{line}({name})"))
    total = sum(r[0] for r in rows)
    print(f"profiled CPU: {1000 * total / requests:.2f} ms per request ({requests} answered)")
    print(f"{'own us/req':>10} {'cum us/req':>10} {'calls/req':>9}  function")
    for own, cumulative, calls, where in sorted(rows, reverse=True)[:top]:
        print(f"{1e6 * own / requests:10.1f} {1e6 * cumulative / requests:10.1f} "
              f"{calls / requests:9.2f}  {where}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.request_profile", description=__doc__)
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s (100)")
    parser.add_argument("--seconds", type=float, default=10.0, help="(10)")
    parser.add_argument("--out", type=Path, default=Path("router.prof"), help="the stats file")
    parser.add_argument("--top", type=int, default=30, help="rows (30)")
    parser.add_argument("--baseline", type=Path, default=None, help="also profile this checkout")
    args = parser.parse_args()
    runs = [(None, args.out)]
    if args.baseline is not None:
        runs.append((args.baseline, args.out.with_suffix(".baseline.prof")))
    for source, out in runs:
        result = asyncio.run(profile(args, source, out.resolve()))
        print(f"== {source or 'this checkout'}: {result}")
        report(out, max(1, int(result["ok"])), args.top)


if __name__ == "__main__":
    main()
