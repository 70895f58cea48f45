"""A batch on idle capacity beside interactive traffic (issue #32's bench goal).

``python -m bench.batch_idle [--size full] [--feeder waves,pool]`` (under ``switchyard
embedded`` or with ``REDIS_URL`` set) starts the contention scenario's simulator backends and
the real router (pinned with ``taskset`` like the harness's), then runs, one after another:

1. **interactive alone**: the contention scenario's interactive requests (its baseline phase,
   0.6x capacity, the ``interactive`` share of every tenant) for a phase, while the backends'
   ``vllm:num_requests_running`` is sampled: the slots interactive traffic holds, so the
   share of the pool it leaves idle;
2. per feeder, **the batch alone**: a batch's lines (prompt and output lengths drawn from the
   scenario) sent in the ``batch`` class with a key the snapshot marks ``batch`` (a Batch API
   executor's), for a phase: the lines/s the whole pool gives a batch;
3. per feeder, **both**: the same interactive schedule and the batch at once.

Feeders: ``waves`` sends what the executor's tick does today (claim ``--claim`` lines, send
them all, wait for the last answer, claim again); ``pool`` keeps ``--claim`` lines in flight
(a line starts as soon as one ends). A 429 or 5xx line is sent again after 0.5 s.

It prints the interactive TTFT SLO attainment with and without the batch (goal: within 1
point) and the batch's lines/s beside the interactive traffic over what the pool leaves idle,
``lines/s alone x idle share`` (goal: at least 0.9). It runs the router and the engines only:
no control plane, database or Celery (the feeders send what the executor would, the way it
would).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import random
import tempfile
import time
import uuid
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import redis

from bench.backends import RUNNING, gauge, start_backends, wait_idle
from bench.loadgen import PhaseRun, Result, request_body, run_phase, send_one
from bench.procs import free_port, pinned, router_cpus, spawn, wait_http
from bench.scenario import Scenario, load
from bench.targets.base import REPO_ROOT, python_argv, python_env
from bench.workload import PhasePlan, Planned, plan_phase
from runtime.procs import Child
from runtime.snapshot_store import publish
from runtime.testing.snapshots import SnapshotBuilder, limits

SIZES = {"smoke": (4.0, 200), "medium": (15.0, 1000), "full": (30.0, 2000)}  # phase s, lines
BATCH_TENANT = "batchco"
RETRY_S = 0.5


@dataclass
class Fed:
    """What one feeder got done within the phase."""

    done: int = 0  # lines answered 200 before the phase ended
    retried: int = 0
    failed: int = 0
    finished_at: float | None = None  # every line answered (s from the start), if it was


@dataclass(frozen=True)
class Stage:
    """The running router and engines, and what the runs send."""

    session: aiohttp.ClientSession
    router: str
    engines: list[Child]
    scenario: Scenario
    keys: dict[str, str]


@dataclass
class Run:
    interactive: list[Result] = field(default_factory=list)
    running: list[float] = field(default_factory=list)  # sampled engine slots in use
    fed: Fed | None = None


def _keys(scenario: Scenario) -> dict[str, str]:
    names = [t.name for t in scenario.tenants] + [BATCH_TENANT]
    return {name: f"sy_bidl{i:04d}_" + "c" * 40 for i, name in enumerate(names)}


def world(scenario: Scenario, urls: Sequence[str], keys: dict[str, str]) -> SnapshotBuilder:
    builder = SnapshotBuilder()
    for spec in scenario.classes.values():
        builder.add_class(spec.name, band=spec.priority_band, ttft_slo_ms=int(spec.ttft_slo_ms),
                          deadline_ms=max(spec.deadline_ms, 600_000), max_queue_length=10_000,
                          shed_order=spec.shed_order)  # fmt: skip
    generous = limits(max_context=8192, max_output=4096, rpm=10**6, tpm=10**9,
                      max_concurrency=10_000)  # fmt: skip
    for tenant, key in keys.items():
        klass = "batch" if tenant == BATCH_TENANT else "interactive"
        builder.add_tenant(tenant, classes=(klass,), default_class=klass, tenant_limits=generous)
        builder.add_key(tenant, tenant, full_key=key, batch=tenant == BATCH_TENANT)
    b = scenario.backends
    builder.add_model(b.model, 1, runtime="simulator")
    for i, url in enumerate(urls, start=1):
        builder.add_endpoint(i, 1, url, capacity=b.max_num_seqs)
    return builder


def interactive_plan(scenario: Scenario, phase_s: float) -> PhasePlan:
    """The baseline phase's schedule, its interactive requests only."""
    plan = plan_phase(scenario, scenario.phases[0], duration_s=phase_s, max_requests=100_000)
    kept = tuple(p for p in plan.requests if p.klass == "interactive")
    return dataclasses.replace(plan, requests=kept)


def batch_lines(scenario: Scenario, count: int) -> list[bytes]:
    rng = random.Random(scenario.seed + 32)
    bodies = []
    for i in range(count):
        planned = Planned(index=i, at=0.0, tenant=BATCH_TENANT, klass="batch",
                          prompt_tokens=scenario.prompt.sample(rng),
                          max_tokens=scenario.output.sample(rng), stream=False)  # fmt: skip
        bodies.append(request_body(planned, scenario.backends.model))
    return bodies


async def _line(session: aiohttp.ClientSession, url: str, body: bytes, *, key: str, fed: Fed,
                origin: float, until: float) -> None:  # fmt: skip
    headers = {"Authorization": f"Bearer {key}", "X-Switchyard-Class": "batch",
               "Content-Type": "application/json"}  # fmt: skip
    planned = Planned(index=0, at=0.0, tenant=BATCH_TENANT, klass="batch", prompt_tokens=0,
                      max_tokens=0, stream=False)  # fmt: skip
    while True:
        result = Result(planned=planned)
        await send_one(session, url, body, headers, result, origin=origin, timeout_s=600.0)
        if result.status == 200:
            if result.end <= until:
                fed.done += 1
            return
        if result.status not in (0, 429, 500, 502, 503, 504):
            fed.failed += 1
            return
        fed.retried += 1
        await asyncio.sleep(RETRY_S)


async def feed(session: aiohttp.ClientSession, url: str, key: str, bodies: list[bytes], *,
               mode: str, claim: int, origin: float, until: float) -> Fed:  # fmt: skip
    """Send every line (``waves`` or ``pool``), stop starting new ones at ``until``."""
    fed = Fed()
    todo = list(bodies)
    if mode == "waves":
        while todo and time.perf_counter() - origin < until:
            wave, todo = todo[:claim], todo[claim:]
            await asyncio.gather(*(_line(session, url, b, key=key, fed=fed, origin=origin,
                                         until=until) for b in wave))  # fmt: skip
    else:
        gate = asyncio.Semaphore(claim)

        async def one(body: bytes) -> None:
            async with gate:
                if time.perf_counter() - origin < until:
                    await _line(session, url, body, key=key, fed=fed, origin=origin,
                                until=until)  # fmt: skip

        await asyncio.gather(*(one(b) for b in todo))
        todo = []
    if not todo and fed.done + fed.failed == len(bodies):
        fed.finished_at = time.perf_counter() - origin
    return fed


async def sample_running(session: aiohttp.ClientSession, engines: list[Child],
                         out: list[float], stop: asyncio.Event) -> None:  # fmt: skip
    while not stop.is_set():
        total = 0.0
        for engine in engines:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with session.get(f"{engine.base_url}/metrics") as resp:
                    total += gauge(await resp.text(), RUNNING)
        out.append(total)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=0.25)


async def one_run(stage: Stage, *, plan: PhasePlan | None, bodies: list[bytes] | None,
                  mode: str, claim: int, phase_s: float) -> Run:  # fmt: skip
    session, router, engines = stage.session, stage.router, stage.engines
    scenario, keys = stage.scenario, stage.keys
    run, stop = Run(), asyncio.Event()
    sampler = asyncio.create_task(sample_running(session, engines, run.running, stop))
    origin = time.perf_counter()
    tasks: list[Coroutine[Any, Any, PhaseRun | Fed]] = []
    if plan is not None:
        tasks.append(run_phase(
            session, plan, base_urls=[router], model=scenario.backends.model, timeout_s=60.0,
            headers_for=lambda p: {"Authorization": f"Bearer {keys[p.tenant]}",
                                   "X-Switchyard-Class": p.klass,
                                   "Content-Type": "application/json"},
            drain_timeout_s=20.0,
        ))  # fmt: skip
    if bodies is not None:
        url = f"{router}/v1/chat/completions"
        tasks.append(feed(session, url, keys[BATCH_TENANT], bodies, mode=mode, claim=claim,
                          origin=origin, until=phase_s))  # fmt: skip
    outcomes = await asyncio.gather(*tasks)
    stop.set()
    await sampler
    for outcome in outcomes:
        if isinstance(outcome, Fed):
            run.fed = outcome
        else:
            run.interactive = outcome.results
    await wait_idle(engines, session, timeout_s=120.0)
    return run


def slo_share(results: list[Result], slo_s: float) -> float:
    met = sum(1 for r in results if r.ok and r.ttft is not None and r.ttft <= slo_s)
    return met / len(results) if results else float("nan")


async def bench(args: argparse.Namespace) -> None:
    scenario = load(args.scenario)
    phase_s, lines = SIZES[args.size]
    keys = _keys(scenario)
    work = Path(tempfile.mkdtemp(prefix="bench-batch-idle-"))
    prefix = f"bench:batchidle:{uuid.uuid4().hex[:8]}"
    client: redis.Redis[bytes] = redis.Redis.from_url(os.environ["REDIS_URL"])
    children: list[Child] = []
    timeout = aiohttp.ClientTimeout(total=None)
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        try:
            engines = await start_backends(scenario.backends, session=session, log_dir=work,
                                           cpus=(), timeout_s=60.0)  # fmt: skip
            children += engines
            snapshot = world(scenario, [e.base_url for e in engines], keys).snapshot()
            publish(client, snapshot, prefix=f"{prefix}:snapshot")
            port = free_port()
            env = python_env({
                "REDIS_URL": os.environ["REDIS_URL"], "SWITCHYARD_VAR_DIR": str(work),
                "SWITCHYARD_SNAPSHOT_PREFIX": f"{prefix}:snapshot",
                "SWITCHYARD_LIMITS_PREFIX": f"{prefix}:limits",
                "SWITCHYARD_FAIRNESS_PREFIX": f"{prefix}:fairness",
                "SWITCHYARD_KEY_USAGE_HASH": f"{prefix}:apikey",
            })  # fmt: skip
            argv = python_argv("runtime.gateway", "--host", "127.0.0.1", "--port", str(port),
                               "--workers", "1", "--log-level", "warning")  # fmt: skip
            router = spawn("router", pinned(argv, router_cpus()), port=port, log_dir=work,
                           env=env, cwd=REPO_ROOT)  # fmt: skip
            children.append(router)
            await wait_http(router, session, "/readyz", timeout_s=60.0)
            stage = Stage(session, router.base_url, engines, scenario, keys)
            await report(stage, args, phase_s=phase_s, lines=lines)
        finally:
            for child in children:
                await asyncio.to_thread(child.stop)
            stale = list(client.scan_iter(match=f"{prefix}:*"))
            if stale:
                client.delete(*stale)
            client.close()


async def report(stage: Stage, args: argparse.Namespace, *, phase_s: float, lines: int) -> None:
    scenario = stage.scenario
    plan = interactive_plan(scenario, phase_s)
    slo_s = scenario.classes["interactive"].ttft_slo_ms / 1000.0
    slots = scenario.backends.count * scenario.backends.max_num_seqs
    alone = await one_run(stage, plan=plan, bodies=None, mode="", claim=args.claim,
                          phase_s=phase_s)  # fmt: skip
    held = sum(alone.running) / max(1, len(alone.running))
    idle = max(0.0, 1.0 - held / slots)
    base_slo = slo_share(alone.interactive, slo_s)
    print(f"scenario {args.scenario} size {args.size}: phases of {phase_s:.0f} s, a batch of "
          f"{lines} lines, claim {args.claim}; {len(plan.requests)} interactive requests "
          f"({len(plan.requests) / phase_s:.1f}/s)")  # fmt: skip
    print(f"interactive alone: SLO attainment {base_slo:.2%}; engine slots in use "
          f"{held:.1f} of {slots}: idle share {idle:.2%}")  # fmt: skip
    for mode in args.feeder:
        solo = await one_run(stage, plan=None, bodies=batch_lines(scenario, lines), mode=mode,
                             claim=args.claim, phase_s=phase_s)  # fmt: skip
        assert solo.fed is not None
        both = await one_run(stage, plan=plan, bodies=batch_lines(scenario, lines), mode=mode,
                             claim=args.claim, phase_s=phase_s)  # fmt: skip
        assert both.fed is not None
        solo_rate, both_rate = solo.fed.done / phase_s, both.fed.done / phase_s
        left = solo_rate * idle
        with_slo = slo_share(both.interactive, slo_s)
        ratio = both_rate / left if left > 0 else float("nan")
        points = (base_slo - with_slo) * 100
        print(f"[{mode}] batch alone {solo_rate:.1f} lines/s; beside interactive "
              f"{both_rate:.1f} lines/s = {ratio:.2f}x the idle capacity ({left:.1f} lines/s) "
              f"[goal >= 0.9: {'met' if ratio >= 0.9 else 'NOT met'}]; interactive SLO "
              f"{with_slo:.2%}, {points:+.1f} points vs alone [goal <= 1: "
              f"{'met' if points <= 1.0 else 'NOT met'}]; retries {both.fed.retried}, "
              f"failed {both.fed.failed}")  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.batch_idle",
                                     description=(__doc__ or "").splitlines()[0])  # fmt: skip
    parser.add_argument("--scenario", type=Path, default=Path("bench/scenarios/contention.toml"))
    parser.add_argument("--size", choices=sorted(SIZES), default="full")
    parser.add_argument("--feeder", type=lambda s: s.split(","), default=["waves", "pool"],
                        help="waves (the executor's tick today), pool, or both")  # fmt: skip
    parser.add_argument("--claim", type=int, default=32, help="lines in flight (claim size)")
    asyncio.run(bench(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
