"""The scheduler alone, on a scenario's schedule, in virtual time: no network, no noise.

``python -m bench.dispatch_sim [--scenario bench/scenarios/contention.toml] [--size full]
[--policy headroom=0.5 ...]`` plays every phase of the scenario (the same deterministic
schedule the harness sends, :func:`bench.workload.plan_phase`) through a real
:class:`~runtime.scheduling.dispatcher.PoolDispatcher` over an in-memory fleet
(:class:`~runtime.testing.fleet.HandFleet`: the scenario's backends, each with
``max_num_seqs`` slots), with a virtual clock that jumps from event to event. An engine is
modelled as the simulator's timing (``runtime.workers.simulator``): a request's first token
comes one prefill plus one decode step after its dispatch, at the batch size it joins; it
holds its slot for the prefill plus ``max_tokens`` decode steps. Engines never queue (the
router's slots equal their sequences), so every wait here is the router's.

It prints, per phase, tenant and class, the TTFT p50 / p95 in ms over the requests that got a
slot, and for each tenant that does not flood its p95 under the flood over its baseline's.
Runs take seconds and repeat exactly, so a change to a scheduling policy can be judged here
before a (noisy) harness run; the figures are the scheduler's share of the latency, not a
router's. Each phase starts once the previous one has drained, as in ``bench run``.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.scenario import Scenario, load
from bench.workload import Planned, plan_phase
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Grant, SchedulingError, Ticket
from runtime.scheduling.settings import PoolSettings
from runtime.testing.fleet import HandFleet


@dataclass(frozen=True, slots=True)
class Outcome:
    phase: str
    tenant: str
    klass: str
    ttft_s: float | None  # None: refused or dropped


@dataclass(slots=True)
class _Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def _ticket(scenario: Scenario, p: Planned, now: float, weight: float) -> Ticket:
    spec = scenario.classes[p.klass]
    return Ticket(
        tenant=p.tenant, version=1, input_tokens=p.prompt_tokens, max_output_tokens=p.max_tokens,
        band=spec.priority_band, class_name=p.klass, shed_order=spec.shed_order, weight=weight,
        deadline=now + spec.deadline_ms / 1000.0,
    )  # fmt: skip


async def simulate(
    scenario: Scenario, settings: PoolSettings, *, phase_s: float, max_requests: int = 100_000
) -> list[Outcome]:
    """Every request of every phase, in virtual time; see the module docstring."""
    b = scenario.backends
    fleet = HandFleet()
    for endpoint_id in range(1, b.count + 1):
        fleet.add(endpoint_id, capacity=b.max_num_seqs)
    clock = _Clock()
    dispatcher = PoolDispatcher("p", settings, fleet, clock=clock, tick_s=3600.0)
    dispatcher.start()
    weights = {t.name: t.weight for t in scenario.tenants}
    order = itertools.count()
    outcomes: list[Outcome] = []
    loop = asyncio.get_running_loop()
    try:
        for phase in scenario.phases:  # each starts once the previous one drained, as in `run`
            plan = plan_phase(scenario, phase, duration_s=phase_s, max_requests=max_requests)
            start = clock.now
            events: list[tuple[float, int, Planned | Grant]] = [
                (start + p.at, next(order), p) for p in plan.requests
            ]
            heapq.heapify(events)
            waiting: dict[int, tuple[asyncio.Task[Grant], Planned, float]] = {}
            while events:
                at, key, item = heapq.heappop(events)
                clock.now = at
                if isinstance(item, Planned):
                    ticket = _ticket(scenario, item, at, weights[item.tenant])
                    waiting[key] = (loop.create_task(dispatcher.acquire(ticket)), item, at)
                else:
                    item.release()
                for _ in range(4):  # let the woken acquire() calls return
                    await asyncio.sleep(0)
                for wait_key, (task, p, arrived) in list(waiting.items()):
                    if not task.done():
                        continue
                    del waiting[wait_key]
                    if isinstance(task.exception(), SchedulingError):
                        outcomes.append(Outcome(phase.name, p.tenant, p.klass, None))
                        continue
                    grant = task.result()
                    endpoint = grant.endpoint
                    batch = fleet.inflight.get(endpoint.id, 1) if endpoint is not None else 1
                    step = (b.decode_a_ms + b.decode_b_ms * batch) / 1000.0
                    prefill = p.prompt_tokens / b.prefill_tps
                    ttft = at - arrived + prefill + step
                    outcomes.append(Outcome(phase.name, p.tenant, p.klass, ttft))
                    done = at + prefill + p.max_tokens * step
                    heapq.heappush(events, (done, next(order), grant))
    finally:
        await dispatcher.stop()
    return outcomes


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def table(scenario: Scenario, outcomes: Sequence[Outcome]) -> dict[str, dict[str, float | None]]:
    """``"phase tenant class"`` -> n, failed, p50_ms, p95_ms; ``"ratio tenant"`` -> the
    tenant's TTFT p95 (every class) in the last phase over the first, for non-flooders."""
    out: dict[str, dict[str, float | None]] = {}
    for phase in scenario.phases:
        for tenant in scenario.tenants:
            for klass in sorted(tenant.classes):
                where = (phase.name, tenant.name, klass)
                rows = [o for o in outcomes if (o.phase, o.tenant, o.klass) == where]
                ms = [o.ttft_s * 1000.0 for o in rows if o.ttft_s is not None]
                out[f"{phase.name} {tenant.name} {klass}"] = {
                    "n": len(ms), "failed": len(rows) - len(ms),
                    "p50_ms": _pct(ms, 0.5), "p95_ms": _pct(ms, 0.95),
                }  # fmt: skip
    first, last = scenario.phases[0].name, scenario.phases[-1].name
    for tenant in scenario.tenants:
        if tenant.flooding:
            continue
        p95 = {
            name: _pct([o.ttft_s for o in outcomes
                        if o.phase == name and o.tenant == tenant.name and o.ttft_s is not None],
                       0.95)
            for name in (first, last)
        }  # fmt: skip
        base, flood = p95[first], p95[last]
        out[f"ratio {tenant.name}"] = {
            "p95_over_baseline": flood / base if base and flood else None
        }
    return out


def _cell(name: str, value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.2f}" if name == "p95_over_baseline" else f"{value:.0f}"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch_sim")
    parser.add_argument("--scenario", type=Path, default=Path("bench/scenarios/contention.toml"))
    parser.add_argument("--size", default="full", help="whose phase_duration_s to use")
    parser.add_argument(
        "--policy", action="append", default=[], metavar="KEY=VALUE",
        help="a pool policy (as in PoolSnap.policies), e.g. headroom=0.5",
    )  # fmt: skip
    args = parser.parse_args(argv)
    scenario = load(args.scenario)
    policies = dict(scenario.switchyard.policies)
    for item in args.policy:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--policy wants KEY=VALUE, got {item!r}")
        policies[key.strip()] = value.strip()
    settings = PoolSettings.from_policies(policies, ())
    phase_s = scenario.size(args.size).phase_duration_s
    outcomes = asyncio.run(simulate(scenario, settings, phase_s=phase_s))
    print(f"{scenario.name}, {args.size} ({phase_s:g} s phases), policies {policies or 'default'}")
    for key, row in table(scenario, outcomes).items():
        cells = "  ".join(f"{name}={_cell(name, value)}" for name, value in row.items())
        print(f"{key:34} {cells}")


if __name__ == "__main__":
    main()
