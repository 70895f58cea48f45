"""Router CPU per request with TLS, against plain HTTP, at a fixed rate (issue #30's goal:
TLS costs at most 15% more router CPU per request at 100 req/s).

``python -m bench.tls_micro [--rate 100] [--seconds 10] [--rounds 3]`` starts the harness's
``switchyard`` (plain HTTP), ``switchyard-tls`` (HTTPS at the router) and ``switchyard-mtls``
(HTTPS, and mutual TLS to backends of its own) targets in front of simulator backends (the
``latency`` scenario's), each router pinned to the last core with ``taskset``, the backends and
this load generator on the others. Then, ``rounds`` times and in turn (so drift hits every
target alike), it sends ``rate`` streamed chat completions per second for ``seconds`` to one
target on kept-alive connections (its session trusts the run's CA) and reads the router's CPU
seconds from ``/proc`` (its processes and children, as the harness does). A round whose send
lag p99 is over 10 ms or with a failed request is marked ``saturated``: the machine, not the
router, set its pace. Prints one JSON document: per target and round the CPU milliseconds per
request, and each TLS target's median over plain's median.

``--targets a,b,...`` compares other harness targets the same way, the first being the
baseline of the ratios (issue #27's A/B of the router's HTTP entry:
``--targets switchyard-channels,switchyard-asgi,bare-proxy``; and its chassis-versus-stages
split: ``--targets bare-proxy,transport-proxy,switchyard-chassis,switchyard``, the router's
transport alone, its chassis with the fewest stages, and the whole router).
``--baseline DIR`` runs each Switchyard target twice in the same rounds: from this checkout and
from the checkout at ``DIR`` (``<target>@baseline``, e.g. ``git archive main | tar -x -C DIR``),
so a change's effect is measured side by side with the code before it, under the same load.

Needs Redis (``REDIS_URL``), like the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.backends import start_backends
from bench.procs import CpuSampler, router_cpus
from bench.runner import DEFAULT_REDIS_URL, client_cpus, new_key
from bench.scenario import load
from bench.targets import FACTORIES, Target, TargetContext
from bench.targets.switchyard import SwitchyardTarget
from config.tls import ensure_local_pki
from runtime.tls import ClientTLS

TARGETS = ("switchyard", "switchyard-tls", "switchyard-mtls")
BASELINE = "@baseline"
SCENARIO = Path(__file__).resolve().parent / "scenarios" / "latency.toml"
LAG_BUDGET_MS = 10.0
_ID = re.compile(rb'"id":"[^"]*"')
_CREATED = re.compile(rb'"created":\d+')


def request_body(model: str) -> dict[str, Any]:
    """The streamed chat completion every round sends."""
    return {"model": model, "messages": [{"role": "user", "content": "hello " * 40}],
            "max_tokens": 8, "stream": True}  # fmt: skip


async def _one(session: aiohttp.ClientSession, url: str, key: str, model: str) -> bool:
    try:
        async with session.post(
            f"{url}/v1/chat/completions", json=request_body(model),
            headers={"Authorization": f"Bearer {key}"}, timeout=aiohttp.ClientTimeout(total=30),
        ) as resp:  # fmt: skip
            await resp.read()
            return resp.status == 200
    except (aiohttp.ClientError, TimeoutError):
        return False


def comparable(body: bytes) -> bytes:
    """A streamed answer with what differs per request blanked: the response id (the engine
    takes it from ``X-Request-Id``, which a router sets) and the ``created`` second."""
    return _CREATED.sub(b'"created":0', _ID.sub(b'"id":""', body))


async def same_bytes(session: aiohttp.ClientSession, url: str, direct: list[str], *,
                     key: str, model: str) -> bool:  # fmt: skip
    """Whether ``url`` answers the rounds' request with the bytes one of the ``direct``
    backends gives (each seeds its text differently; a target sends to any of them)."""

    async def body(base: str) -> bytes:
        async with session.post(
            f"{base}/v1/chat/completions", json=request_body(model),
            headers={"Authorization": f"Bearer {key}"}, timeout=aiohttp.ClientTimeout(total=30),
        ) as resp:  # fmt: skip
            return comparable(await resp.read()) if resp.status == 200 else b""

    got = await body(url)
    return bool(got) and got in {await body(base) for base in direct}


async def paced(target: Target, session: aiohttp.ClientSession, *, key: str, model: str,
                rate: float, seconds: float) -> dict[str, Any]:  # fmt: skip
    """``rate`` requests/s for ``seconds`` to ``target``; its router's CPU per request."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    sampler = asyncio.create_task(CpuSampler(target.pids()).run(stop))
    url, count = target.base_urls[0], int(rate * seconds)
    start = loop.time() + 0.05
    lags: list[float] = []
    tasks = []
    for i in range(count):
        at = start + i / rate
        await asyncio.sleep(max(0.0, at - loop.time()))
        lags.append((loop.time() - at) * 1000)
        tasks.append(asyncio.create_task(_one(session, url, key, model)))
    results = await asyncio.gather(*tasks)
    stop.set()
    usage = await sampler
    ok = sum(results)
    lag_p99 = statistics.quantiles(lags, n=100)[98] if len(lags) > 1 else 0.0
    return {
        "sent": count, "ok": ok, "router_cpu_s": round(usage.cpu_s, 3),
        "cpu_ms_per_request": round(1000 * usage.cpu_s / max(ok, 1), 4),
        "send_lag_p99_ms": round(lag_p99, 2),
        "saturated": lag_p99 > LAG_BUDGET_MS or ok < count,
    }  # fmt: skip


@dataclass
class Run:
    """The started targets of a run, and what a round needs to load them."""

    session: aiohttp.ClientSession
    targets: list[Target]
    key: str
    model: str
    direct: list[str]  # the backends' URLs


@contextlib.asynccontextmanager
async def running(targets_arg: str, baseline: Path | None) -> AsyncIterator[Run]:
    """The backends and the chosen targets started (``targets_arg`` comma-separated, each
    Switchyard one also from ``baseline`` when given), the load generator off the routers'
    core; everything stopped on exit."""
    scenario = load(SCENARIO)
    work = Path(tempfile.mkdtemp(prefix="switchyard-tls-micro-"))
    (work / "logs").mkdir()
    pki, _ = ensure_local_pki(work)
    routers = router_cpus()
    if routers:  # the load generator off the routers' core, as the harness does
        os.sched_setaffinity(0, client_cpus(routers))
    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, ssl=ClientTLS(ca=pki.ca).context())
    )
    keys = {t.name: new_key() for t in scenario.tenants}
    backends = []
    targets: list[Target] = []
    chosen = [n for n in targets_arg.split(",") if n] or list(TARGETS)
    names = [*chosen, *(f"{n}{BASELINE}" for n in chosen
                        if baseline is not None and n.startswith("switchyard"))]  # fmt: skip
    try:
        backends = await start_backends(
            scenario.backends, session=session, log_dir=work / "logs",
            cpus=client_cpus(routers) if routers else (), timeout_s=60.0,
        )  # fmt: skip
        ctx = TargetContext(
            scenario=scenario, backend_urls=[b.base_url for b in backends], work_dir=work / "logs",
            redis_url=os.environ.get("REDIS_URL", DEFAULT_REDIS_URL), run_id=uuid.uuid4().hex[:8],
            router_cpus=routers, session=session, keys=keys, pki=pki,
            backend_cpus=client_cpus(routers) if routers else (),
        )  # fmt: skip
        for name in names:
            target = FACTORIES[name.removesuffix(BASELINE)]()
            if name.endswith(BASELINE):
                assert isinstance(target, SwitchyardTarget)
                target.name, target.source = name, baseline
            targets.append(target)
            await target.start(ctx)
        yield Run(session, targets, next(iter(keys.values())), scenario.backends.model,
                  [b.base_url for b in backends])  # fmt: skip
    finally:
        for target in targets:
            await target.stop()
        for child in backends:
            await asyncio.to_thread(child.stop)
        await session.close()


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    chosen = [n for n in args.targets.split(",") if n] or list(TARGETS)
    routers = list(router_cpus())  # before running() pins this process off them
    rounds: dict[str, list[dict[str, Any]]] = {}
    async with running(args.targets, args.baseline) as run:
        rounds = {target.name: [] for target in run.targets}
        names = list(rounds)
        checked = {
            target.name: await same_bytes(run.session, target.base_urls[0], run.direct,
                                          key=run.key, model=run.model)
            for target in run.targets
        }  # fmt: skip
        for _ in range(args.rounds):
            for target in run.targets:
                rounds[target.name].append(
                    await paced(target, run.session, key=run.key, model=run.model,
                                rate=args.rate, seconds=args.seconds)
                )  # fmt: skip
                print(target.name, json.dumps(rounds[target.name][-1]), file=sys.stderr,
                      flush=True)  # progress: a killed run keeps its finished rounds  # fmt: skip
                await asyncio.sleep(1.0)  # the backends drain
    medians = {
        name: statistics.median(r["cpu_ms_per_request"] for r in rs) for name, rs in rounds.items()
    }
    return {
        "rate_rps": args.rate, "seconds": args.seconds, "rounds": rounds,
        "same_bytes_as_direct": checked,
        "median_cpu_ms_per_request": medians,
        "ratio_vs_plain": {  # over the first target's median (its baseline's for a baseline)
            name: round(medians[name] / medians[plain], 3)
            for name in names
            for plain in [chosen[0] + BASELINE if name.endswith(BASELINE) else chosen[0]]
            if name != plain and plain in medians
        },
        "ratio_vs_baseline": {
            name: round(medians[name] / medians[name + BASELINE], 3)
            for name in chosen
            if name + BASELINE in medians
        },
        "router_cpus": routers, "load_average": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tls_micro", description=__doc__)
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s (100)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per round (10)")
    parser.add_argument("--rounds", type=int, default=3, help="per target (3)")
    parser.add_argument(
        "--targets", default=",".join(TARGETS),
        help=f"comma-separated harness targets, the first the ratios' base ({','.join(TARGETS)})",
    )  # fmt: skip
    parser.add_argument(
        "--baseline", type=Path, default=None, help="also run each target from this checkout"
    )
    print(json.dumps(asyncio.run(main_async(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
