"""Oracle bounds for issue #34's goals, in :mod:`bench.dispatch_sim`'s virtual time.

Bench-only arms that no router or engine runs today (they are not product code): they bound
what any rule could reach in the contention scenario, so a goal they miss is out of reach
for this scenario and engine model. The baseline phase is played as in every other arm; in
the flood phase:

- ``alone``: the flooder's requests are dropped; the well-behaved traffic runs on its own.
  With the scenario's paired draws (the flood phase's ``arrivals_from``) its p95 over
  baseline is what the flooder's baseline share costs; without them, also the metric's own
  spread between two draws of the same traffic.
- ``full`` (the brief's oracle c): ``alone``, with every engine step costing a full batch's
  decode (``decode_b_ms`` x ``max_num_seqs``) and the engines never idle within the phase
  (phantom sequences that only decode: no prefill, and they give their slots up at once).
  Its tokens/s count the phantoms' tokens.
- ``free`` (oracle a): the flooder's requests bypass the dispatcher and fill every slot the
  well-behaved tenants leave; a well-behaved grant that finds its engine full preempts a
  flooder generation at once (the last one admitted), and the victim keeps its KV cache: it
  prefills only what it had not, resuming first from the flooder's FIFO backlog on any
  engine. The engines schedule as vLLM does (FCFS, chunked). ``free-paid``: the victim
  re-prefills its prompt and what it generated.
- ``yield`` (oracle b): ``free``, and in every engine step the flooder's work comes last:
  the well-behaved sequences are scheduled first, the flooder's decodes take the budget left,
  and its prefills only go in steps where no well-behaved request prefills, at most N tokens a
  step in ``yieldN`` (``yield64-paid``: with the re-prefill paid).
- ``queue``: no preemption; a well-behaved grant that finds its engine full waits in the
  engine's waiting queue, which the engine orders ahead of the flooder's (vLLM's priority
  scheduling with the router over-committing the flooder's requests at the lowest priority).
- ``on-free``, ``reserve-free``, ``paced-free``: the sweep's ``on``, ``reserve`` and ``paced``
  arms (:mod:`bench.preempt_sweep`: the router's own take-back) with the engines' free resume
  (``EngineOptions.free_resume``); ``+yield64``: with the engines yielding to the
  well-behaved as ``yield64`` does (the flooder dispatched by the router as usual);
  ``off+yield64``: the flood limit alone with those engines.

``python -m bench.preempt_bound [--seeds 0-7] [--size full] [--arms fcfs,off,alone,...]``
prints per seed and arm the flood phase's tokens/s (and over FCFS's), the well-behaved
interactive SLO share, the worst well-behaved p95 over its baseline, the preemptions and
whether the arm meets the goals (:func:`bench.preempt_sweep.meets`); per seed the bound: the
lowest worst p95 of the oracles whose flooder keeps the engines busy (``free``, ``yield*``,
``queue``) at >= 95 % of FCFS's tokens/s; at the end on how many seeds each arm meets them.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, cast

from bench.dispatch_sim import _Run, play, simulate_run
from bench.preempt_sweep import GOAL_TPS, common_arguments, meets, summarise
from bench.scenario import Scenario, load
from bench.sim_engine import VLLM_BUDGET, Engine, EngineOptions, Seq
from runtime.scheduling.settings import PoolSettings

if TYPE_CHECKING:
    from bench.dispatch_sim import _Waiting
    from bench.workload import Planned
    from runtime.scheduling.grant import Grant
    from runtime.workers.simulator.timing import TimingModel


@dataclass(frozen=True, slots=True)
class Oracle:
    """What becomes of the flooder in the flood phase (module docstring): ``drop``ped,
    ``background`` (outside the dispatcher, in every slot left), or ``dispatch``ed as
    usual with its generations the engines' background work (for ``yields``)."""

    flooder: Literal["drop", "background", "dispatch"]
    yields: bool = False  # the flooder's work last in every step (oracle b)
    bg_chunk: int | None = None  # with ``yields``: its prefill tokens a step at most
    phantom: bool = False  # every step a full batch, engines busy (oracle c)
    preempt: bool = True  # a well-behaved grant preempts the flooder; else waits in the engine
    free_resume: bool = True  # the victim keeps its KV; else re-prefills prompt + generated


@dataclass(frozen=True, slots=True)
class Arm:
    """One arm: the pool's policies, whether it lends and takes back (keeping ``reserve``
    slots unlent), the engines' free resume, and an :class:`Oracle` (None: none)."""

    policies: tuple[tuple[str, str], ...] = ()
    lend: bool = False
    reserve: int = 0
    free_resume: bool = False
    oracle: Oracle | None = None


_PACED = (("pace_prefill_tps", "2500"), ("resume_first", "on"))  # the sweep's ``paced``
_YIELD64 = Oracle("dispatch", yields=True, bg_chunk=64)
ARMS: dict[str, Arm] = {
    "fcfs": Arm((("fairness", "fcfs"),)),
    "off": Arm(),
    "alone": Arm(oracle=Oracle("drop")),
    "full": Arm(oracle=Oracle("drop", phantom=True)),
    "free": Arm(oracle=Oracle("background")),
    "free-paid": Arm(oracle=Oracle("background", free_resume=False)),
    "yield": Arm(oracle=Oracle("background", yields=True)),
    "yield256": Arm(oracle=Oracle("background", yields=True, bg_chunk=256)),
    "yield128": Arm(oracle=Oracle("background", yields=True, bg_chunk=128)),
    "yield64": Arm(oracle=Oracle("background", yields=True, bg_chunk=64)),
    "yield16": Arm(oracle=Oracle("background", yields=True, bg_chunk=16)),
    "yield64-paid": Arm(oracle=Oracle("background", yields=True, bg_chunk=64, free_resume=False)),
    "queue": Arm(oracle=Oracle("background", preempt=False)),
    "on-free": Arm(lend=True, free_resume=True),
    "reserve-free": Arm(lend=True, reserve=3, free_resume=True),
    "paced-free": Arm(_PACED, lend=True, reserve=3, free_resume=True),
    "off+yield64": Arm(oracle=_YIELD64),
    "on-free+yield64": Arm(lend=True, free_resume=True, oracle=_YIELD64),
    "paced-free+yield64": Arm(_PACED, lend=True, reserve=3, free_resume=True, oracle=_YIELD64),
}
DEFAULT_ARMS = ("fcfs", "off", "alone", "full", "free", "free-paid", "yield", "yield256",
                "yield128", "yield64", "yield64-paid", "queue", "paced-free",
                "paced-free+yield64")  # fmt: skip
_LAST = 1 << 20  # the flooder's engine priority band with ``queue``: after everyone


class _Background:
    """A flooder generation's stand-in for a grant: it holds no dispatcher slot."""

    __slots__ = ("charged_output",)

    def __init__(self) -> None:
        self.charged_output = 0

    def release(self) -> None:
        """Nothing to give back."""


@dataclass(slots=True, eq=False)
class OracleEngine(Engine):
    """An engine that knows which sequences are the flooder's (``background``)."""

    background: set[Seq] = field(default_factory=set)
    yields: bool = False
    bg_chunk: int | None = None
    fill: int = 0  # phantom decoding sequences up to this batch size (0: none)
    phantoms: int = 0  # the phantom tokens of the step planned last

    def schedule(self, timing: TimingModel) -> float | None:
        """Plan the next step: vLLM's order, or with ``yields`` the flooder's work last."""
        if self.yields:
            self.plan = self._yielding_plan()
        else:
            Engine.schedule(self, timing)
        plan = self.plan
        self.phantoms = max(self.fill - len(plan), 0)
        if not plan and not self.fill:
            return None
        prefill = sum(chunk for _, chunk in plan)
        return timing.step_seconds(batch_size=len(plan) + self.phantoms, prefill_tokens=prefill)

    def _yielding_plan(self) -> list[tuple[Seq, int]]:
        budget = float("inf") if self.budget is None else float(self.budget)
        plan: list[tuple[Seq, int]] = []
        for seq in [s for s in self.running if s not in self.background]:
            if budget <= 0:
                break
            chunk = int(min(seq.todo, budget))
            budget -= max(chunk, 1)
            plan.append((seq, chunk))
        ahead = [s for s in self.waiting if s not in self.background]
        if self.priority:
            ahead.sort(key=lambda s: s.band)
        for seq in ahead:
            if budget <= 0 or len(self.running) >= self.max_num_seqs:
                break
            self.waiting.remove(seq)
            seq.todo = self._need(seq)
            chunk = int(min(seq.todo, budget))
            budget -= max(chunk, 1)
            self.running.append(seq)
            plan.append((seq, chunk))
        shared = any(chunk > 0 for _, chunk in plan)  # a well-behaved prefill in this step
        left = 0.0 if shared else float(self.bg_chunk or budget)
        for seq in [s for s in self.running if s in self.background]:
            if budget <= 0:
                break
            chunk = int(min(seq.todo, budget, left))
            if seq.todo > 0 and chunk <= 0:
                continue  # its prefill waits for a step of its own
            budget, left = budget - max(chunk, 1), left - chunk
            plan.append((seq, chunk))
        for seq in [s for s in self.waiting if s in self.background]:
            need = self._need(seq)
            if budget <= 0 or len(self.running) >= self.max_num_seqs or (need and left <= 0):
                break
            self.waiting.remove(seq)
            seq.todo = need
            chunk = int(min(need, budget, left))
            budget, left = budget - max(chunk, 1), left - chunk
            self.running.append(seq)
            plan.append((seq, chunk))
        return plan


class OracleRun(_Run):
    """:class:`~bench.dispatch_sim._Run` with an :class:`Oracle` in the flood phase: the
    flooder's requests never reach the dispatcher there (module docstring)."""

    def __init__(
        self,
        scenario: Scenario,
        settings: PoolSettings,
        oracle: Oracle,
        engine: EngineOptions,
        *,
        lend: bool = False,
        reserve: int = 0,
    ) -> None:
        super().__init__(scenario, settings, engine=engine, preempt=lend, lend_reserve=reserve)
        self.oracle = oracle
        self.flood = scenario.phases[-1].name
        self.flooders = {t.name for t in scenario.tenants if t.flooding}
        self.backlog: deque[Seq] = deque()  # the flooder's generations without a slot
        self.current = ""
        for endpoint_id, old in self.engines.items():
            self.engines[endpoint_id] = OracleEngine(
                budget=old.budget, max_num_seqs=old.max_num_seqs,
                priority=old.priority or not oracle.preempt,
                yields=oracle.yields, bg_chunk=oracle.bg_chunk,
            )  # fmt: skip

    async def phase(self, phase: str, requests: Sequence[Planned]) -> None:
        self.current = phase
        await super().phase(phase, requests)

    def arrive(self, phase: str, item: Planned, key: int, waiting: dict[int, _Waiting]) -> None:
        dispatched = self.oracle.flooder == "dispatch"
        if phase != self.flood or item.tenant not in self.flooders or dispatched:
            super().arrive(phase, item, key, waiting)
        elif self.oracle.flooder == "background":
            grant = cast("Grant", _Background())
            seq = Seq(grant, item, self.clock.now, max(item.max_tokens, 1), band=_LAST)
            self.backlog.append(seq)
        if phase == self.flood:
            for endpoint_id, engine in self.engines.items():
                if not engine.stepping:
                    self.step(endpoint_id)

    def step(self, endpoint_id: int) -> None:
        engine = cast("OracleEngine", self.engines[endpoint_id])
        if self.oracle.flooder == "dispatch" and self.current == self.flood:
            # the flooder's generations the dispatcher granted are the engine's background
            engine.background.update(s for s in engine.waiting if s.planned.tenant in self.flooders)
        self._make_room(engine)
        while self.backlog and len(engine.running) + len(engine.waiting) < engine.max_num_seqs:
            seq = self.backlog.popleft()
            engine.background.add(seq)
            engine.waiting.append(seq)
        flow = self.flow.get(self.current)
        in_window = flow is not None and self.clock.now - flow.start < self.phase_s
        phantom = self.oracle.phantom and self.current == self.flood and in_window
        engine.fill = engine.max_num_seqs if phantom else 0
        super().step(endpoint_id)
        if flow is not None and engine.stepping and engine.phantoms:
            flow.tokens += engine.phantoms
            flow.window_tokens += engine.phantoms * in_window

    def _make_room(self, engine: OracleEngine) -> None:
        """Preempt the flooder's generations (the last admitted first) until every sequence
        fits; each keeps what it prefilled (free) and resumes first from the backlog."""
        flow = self.flow.get(self.current)
        if not self.oracle.preempt:
            return
        while len(engine.running) + len(engine.waiting) > engine.max_num_seqs:
            queued = [s for s in engine.waiting if s in engine.background]
            running = [s for s in engine.running if s in engine.background]
            if queued:
                engine.waiting.remove(victim := queued[-1])
            elif running:
                engine.running.remove(victim := running[-1])
                kept = max(victim.todo, 0)
                paid = victim.planned.prompt_tokens + victim.generated
                victim.prefill = kept if self.oracle.free_resume else paid
                if flow is not None:
                    flow.reprefilled += victim.prefill - kept
            else:
                return
            engine.background.discard(victim)
            self.backlog.appendleft(victim)
            if flow is not None:
                flow.preemptions += 1


def run_arm(
    scenario: Scenario, arm: str, *, phase_s: float, budget: int | None = VLLM_BUDGET
) -> _Run:
    """One arm of :data:`ARMS` (module docstring) on ``scenario``, played to the end."""
    spec = ARMS[arm]
    settings = PoolSettings.from_policies(dict(spec.policies), ())
    engine = EngineOptions(budget=budget, free_resume=spec.free_resume)

    async def go() -> _Run:
        if spec.oracle is None:
            return await simulate_run(scenario, settings, phase_s=phase_s, preempt=spec.lend,
                                      lend_reserve=spec.reserve, engine=engine)  # fmt: skip
        run = OracleRun(scenario, settings, spec.oracle, engine, lend=spec.lend,
                        reserve=spec.reserve)  # fmt: skip
        await play(run, phase_s=phase_s)
        return run

    return asyncio.run(go())


def bound(rows: dict[str, dict[str, float]]) -> tuple[str, float] | None:
    """The lowest worst p95 among the oracle arms in ``rows`` whose flooder keeps the
    engines busy, at >= 95 % of ``rows["fcfs"]``'s tokens/s: (arm, p95); None if none."""
    fcfs_tps = rows["fcfs"]["tps"]
    busy = [(r["worst_p95"], arm) for arm, r in rows.items()
            if (oracle := ARMS[arm].oracle) is not None and oracle.flooder == "background"
            and r["tps"] >= GOAL_TPS * fcfs_tps]  # fmt: skip
    return (min(busy)[1], min(busy)[0]) if busy else None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.preempt_bound")
    common_arguments(parser)
    parser.add_argument(
        "--arms", default=",".join(DEFAULT_ARMS),
        help=f"comma-separated, fcfs first; of {', '.join(ARMS)}",
    )  # fmt: skip
    args = parser.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    unknown = [a for a in arms if a not in ARMS]
    if unknown or not arms or arms[0] != "fcfs":
        parser.error(f"--arms: fcfs first, then of the known arms (unknown: {unknown})")
    if args.max_batched_tokens < 0:
        parser.error("--max-batched-tokens must be >= 0")
    budget = args.max_batched_tokens or None
    print(f"engines: {f'chunked prefill, {budget} tokens a step' if budget else 'whole prefills'}"
          "; per arm: flood tokens/s (% of FCFS's), well-behaved interactive SLO share, worst "
          "well-behaved p95 over baseline, preemptions, goals met")  # fmt: skip
    base = load(args.scenario)
    phase_s = base.size(args.size).phase_duration_s
    met = dict.fromkeys(arms, 0)
    for seed in args.seeds:
        scenario = dataclasses.replace(base, seed=seed)
        rows: dict[str, dict[str, float]] = {}
        for arm in arms:
            r = rows[arm] = summarise(run_arm(scenario, arm, phase_s=phase_s, budget=budget))
            fcfs_tps = rows["fcfs"]["tps"]
            met[arm] += meets(r, fcfs_tps)
            print(f"seed {seed}  {arm:18} {r['tps']:6.0f} ({r['tps'] / fcfs_tps:4.0%})  "
                  f"slo {r['slo']:.2f}  worst_p95 {r['worst_p95']:5.2f}  "
                  f"preempt {r['preemptions']:5.0f}  "
                  f"goals {'yes' if meets(r, fcfs_tps) else 'no'}", flush=True)  # fmt: skip
        best = bound(rows)
        print(
            f"seed {seed}  bound at >= {GOAL_TPS:.0%} of FCFS's tokens/s: "
            + (f"worst p95 {best[1]:.2f} ({best[0]})" if best else "no busy oracle arm")
        )
    print("goals met on " + ", ".join(f"{arm} {n}/{len(args.seeds)}" for arm, n in met.items()))


if __name__ == "__main__":
    main()
