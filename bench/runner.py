"""One run: start the backends and every target, play each phase against each target, report.

Phases are the outer loop and targets the inner one (in an order that rotates from phase to
phase), so drift in the machine's load hits every target alike; before each (phase, target)
the backends are drained to idle. The same schedule is replayed for every target. Every
process started here is stopped in ``finally`` blocks, whatever happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp

from bench import plots, report
from bench.backends import start_backends, wait_idle
from bench.loadgen import HeadersFor, run_phase
from bench.metrics import phase_figures
from bench.prefix_stats import prefix_counters, prefix_figures, reset_prefix_caches
from bench.procs import (
    Child,
    CpuSampler,
    StartError,
    extra_router_cpus,
    free_port,
    router_cpus,
)
from bench.profile import FlameGraph, lag_figures, scrape_lag
from bench.scenario import Scenario, SizeSpec
from bench.targets import FACTORIES, Target, TargetContext, TargetUnavailableError
from bench.workload import PhasePlan, Planned, plan_phase
from config.tls import ensure_local_pki
from runtime import contract
from runtime.tls import ClientTLS

logger = logging.getLogger("bench")
DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def new_key() -> str:
    """An API key in the production format (:mod:`runtime.contract`)."""
    return contract.api_key_new()


def client_cpus(routers: tuple[int, ...]) -> tuple[int, ...]:
    """The cores for the load generator and the backends: all but the routers' one, and on
    a machine of four cores or more also but the one a second router worker takes
    (:func:`bench.procs.extra_router_cpus`), so ``switchyard-2w`` has two cores to itself."""
    allowed = sorted(os.sched_getaffinity(0))
    held = set(routers)
    if len(set(allowed) | held) >= 4:
        held.update(extra_router_cpus(routers, 1))
    rest = tuple(c for c in allowed if c not in held)
    return rest or tuple(allowed)


def request_headers(keys: Mapping[str, str], auth_token: str | None) -> HeadersFor:
    """The headers of each request: the tenant's key (or the target's own token) and class.

    Every target gets the same headers, so none sends more bytes than another.
    """
    cache: dict[tuple[str, str], dict[str, str]] = {}

    def headers_for(planned: Planned) -> dict[str, str]:
        found = cache.get((planned.tenant, planned.klass))
        if found is None:
            token = auth_token or keys[planned.tenant]
            found = cache[(planned.tenant, planned.klass)] = {
                "Authorization": f"Bearer {token}",
                "Content-Type": "application/json",
                "X-Switchyard-Class": planned.klass,
            }
        return found

    return headers_for


async def _start_one(name: str, ctx: TargetContext) -> tuple[Target | None, dict[str, Any]]:
    target = FACTORIES[name]()
    t0 = time.monotonic()
    try:
        await target.start(ctx)
    except TargetUnavailableError as exc:
        await target.stop()
        logger.warning("target %s skipped: %s", name, exc)
        return None, {"status": "skipped", "reason": str(exc)}
    except (StartError, OSError) as exc:
        await target.stop()
        logger.warning("target %s failed to start: %s", name, exc)
        return None, {"status": "failed", "reason": f"did not start: {exc}"[-2000:]}
    except BaseException:
        await target.stop()
        raise
    return target, {"status": "ran", "info": target.info,
                    "start_s": round(time.monotonic() - t0, 2)}  # fmt: skip


async def _start_targets(
    names: Sequence[str], ctx: TargetContext
) -> tuple[list[Target], dict[str, Any]]:
    """Start every target at once (LiteLLM alone takes ~20 s); keep the given order."""
    outcomes = await asyncio.gather(*(_start_one(n, ctx) for n in names), return_exceptions=True)
    started: list[Target] = []
    status: dict[str, Any] = {}
    error: BaseException | None = None
    for name, outcome in zip(names, outcomes, strict=True):
        if isinstance(outcome, BaseException):
            error = error or outcome
            status[name] = {"status": "failed", "reason": repr(outcome)}
            continue
        target, status[name] = outcome
        if target is not None:
            started.append(target)
    if error is not None:
        for target in started:
            await target.stop()
        raise error
    return started, status


async def measure(
    target: Target,
    plan: PhasePlan,
    *,
    scenario: Scenario,
    spec: SizeSpec,
    session: aiohttp.ClientSession,
    backends: Sequence[Child],
    keys: Mapping[str, str],
    out_dir: Path | None = None,
) -> dict[str, Any]:
    """Play ``plan`` against ``target`` from idle backends; its figures for the phase.

    A Switchyard router's phase also gets its event-loop lag and, with ``out_dir``, a
    py-spy flame graph there (:mod:`bench.profile`).
    """
    idle = await wait_idle(list(backends), session, timeout_s=max(spec.drain_timeout_s, 5.0))
    reset = await reset_prefix_caches(session, backends)
    counters_before = await prefix_counters(session, backends)
    logger.info("phase %s (%.1f rps, %d requests) -> %s", plan.phase, plan.offered_rps,
                len(plan.requests), target.name)  # fmt: skip
    stop = asyncio.Event()
    pids = target.pids()
    profiled = target.name.startswith("switchyard") and bool(pids)
    lag_before = await scrape_lag(session, target.base_urls[0]) if profiled else None
    flame = None
    if profiled and out_dir is not None:
        flame = FlameGraph(pids[0], out_dir / f"flame-{target.name}-{plan.phase}.svg")
        await flame.start()
    sampling = asyncio.create_task(CpuSampler(pids).run(stop))
    try:
        run = await run_phase(
            session, plan, base_urls=target.base_urls,
            headers_for=request_headers(keys, target.auth_token),
            model=scenario.backends.model, timeout_s=spec.request_timeout_s,
            drain_timeout_s=spec.drain_timeout_s,
        )  # fmt: skip
    finally:
        stop.set()
        usage = await sampling
        flamed = await flame.stop() if flame is not None else None
    figures = phase_figures(scenario, plan, run, usage if pids else None)
    counters_after = await prefix_counters(session, backends)
    figures["prefix_cache"] = prefix_figures(counters_before, counters_after, reset=reset)
    if lag_before is not None:
        lag_after = await scrape_lag(session, target.base_urls[0])
        figures["event_loop_lag"] = lag_figures(lag_before, lag_after or {})
    if flamed is not None:
        figures["flame_graph"] = flamed
    figures["backends_idle_at_start"] = idle
    return figures


def _phase_entry(plan: PhasePlan) -> dict[str, Any]:
    return {
        "offered_rps": plan.offered_rps, "load_factor": plan.load_factor,
        "duration_s": plan.duration_s, "requests": len(plan.requests),
        "truncated": plan.truncated, "tenant_rps": plan.tenant_rps, "targets": {},
    }  # fmt: skip


async def execute(
    scenario: Scenario,
    *,
    size: str,
    target_names: Sequence[str],
    out_dir: Path,
    redis_url: str,
    command: list[str],
    routers: tuple[int, ...] = (),
    flame: bool = True,
    backends_nice: int = 0,
) -> dict[str, Any]:
    """Run ``scenario`` at ``size`` against ``target_names``; return the report's figures.

    ``routers``: the cores every router is pinned to (none: not pinned); the backends get
    the others, at niceness ``backends_nice`` (0: this process's).
    """
    unknown = [t for t in target_names if t not in FACTORIES]
    if unknown:
        raise ValueError(f"unknown targets: {', '.join(unknown)} (known: {', '.join(FACTORIES)})")
    started_at = time.time()
    spec = scenario.size(size)
    keys = {t.name: new_key() for t in scenario.tenants}
    plans = [
        plan_phase(scenario, p, duration_s=spec.phase_duration_s,
                   max_requests=spec.max_requests_per_phase)
        for p in scenario.phases_for(size)
    ]  # fmt: skip
    pki, _ = ensure_local_pki(out_dir)  # HTTPS targets (switchyard-tls): the client trusts it
    connector = aiohttp.TCPConnector(
        limit=0, ttl_dns_cache=None, ssl=ClientTLS(ca=pki.ca).context()
    )
    session = aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None))
    backends: list[Child] = []
    targets: list[Target] = []
    status: dict[str, Any] = {}
    phases: dict[str, Any] = {}
    try:
        events_ports = (
            [free_port() for _ in range(scenario.backends.count)]
            if scenario.backends.kv_events else []
        )  # fmt: skip
        backends = await start_backends(
            scenario.backends, session=session, log_dir=out_dir / "logs",
            cpus=client_cpus(routers) if routers else (), timeout_s=60.0,
            events_ports=events_ports, nice=backends_nice,
        )  # fmt: skip
        ctx = TargetContext(
            scenario=scenario, backend_urls=[b.base_url for b in backends],
            backend_kv_events=[f"tcp://127.0.0.1:{p}" for p in events_ports],
            work_dir=out_dir / "logs", redis_url=redis_url, run_id=uuid.uuid4().hex[:12],
            router_cpus=routers, session=session, keys=keys, pki=pki,
            backend_cpus=client_cpus(routers) if routers else (),
        )  # fmt: skip
        targets, status = await _start_targets(target_names, ctx)
        for index, plan in enumerate(plans):
            entry = phases[plan.phase] = _phase_entry(plan)
            shift = index % max(len(targets), 1)
            for target in targets[shift:] + targets[:shift]:
                if not target.alive():
                    status[target.name] = {
                        **status[target.name],
                        "status": "failed",
                        "reason": f"exited before phase {plan.phase}",
                    }
                    continue  # fmt: skip
                entry["targets"][target.name] = await measure(
                    target, plan, scenario=scenario, spec=spec, session=session,
                    backends=backends, keys=keys, out_dir=out_dir if flame else None,
                )  # fmt: skip
            order = [t.name for t in targets]
            entry["targets"] = {n: entry["targets"][n] for n in order if n in entry["targets"]}
    finally:
        for target in targets:
            with contextlib.suppress(Exception):
                await target.stop()
        for child in backends:
            await asyncio.to_thread(child.stop)
        await session.close()
    placement = {"router_cpus": list(routers), "client_cpus": list(client_cpus(routers))}
    return report.build(scenario, size=size, command=command, targets=status,
                        phases=phases, started=started_at, placement=placement)  # fmt: skip


def run_sync(
    scenario: Scenario, *, out_dir: Path, pin: bool = True, **kwargs: Any
) -> dict[str, Any]:
    """:func:`execute` on a fresh event loop (uvloop when installed); write report and plots.

    With ``pin``, routers get the last core and this process (the load generator) the
    others, for the run only.
    """
    try:
        import uvloop  # noqa: PLC0415

        factory = uvloop.new_event_loop
    except ImportError:  # pragma: no cover
        factory = None
    out_dir = out_dir.resolve()  # children run in other folders: every path is absolute
    out_dir.mkdir(parents=True, exist_ok=True)
    routers = router_cpus() if pin else ()
    affinity = os.sched_getaffinity(0)
    if routers:
        os.sched_setaffinity(0, client_cpus(routers))
    try:
        with asyncio.Runner(loop_factory=factory) as runner:
            result = runner.run(execute(scenario, out_dir=out_dir, routers=routers, **kwargs))
    finally:
        os.sched_setaffinity(0, affinity)
    report.write(result, out_dir)  # first without plots: the figures survive a plot failure
    result["plots"] = plots.plot_report(result, out_dir)
    report.write(result, out_dir)
    return result
