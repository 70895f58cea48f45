"""Preemption against the flood limit and FCFS, over several schedules, in virtual time.

``python -m bench.preempt_sweep [--seeds 0-7] [--size full] [--lend-reserve 3]
[--max-batched-tokens 2048] [--victim fair] [--pace-prefill-tps 2500] [--lend-max-prefill 192]
[--arms fcfs,...]`` plays the contention scenario (:mod:`bench.dispatch_sim`) per seed up to
fifteen ways
(``--arms``, default all): FCFS (``fairness=fcfs``), the flood limit (default policies, no
lending: ``off``), the flood limit with the engines' priority scheduling
(``upstream_priority=on``: ``prio``), the flood limit lending every idle slot and taking
them back by preemption (``on``), the same keeping ``--lend-reserve`` free slots unlent
(``reserve``), that with the lent slots paced by prefill (``pace``: the pool policy
``pace_prefill_tps``, :mod:`runtime.scheduling.pacing`), and that with preempted requests
resuming first as well (``paced``: ``resume_first=on``); then ``paced`` on engines with
prefix caching over the resumes' own tokens (``EngineOptions.resume_cache``: a resume
prefills what its engine's cache does not hold): placed as any request (``cache``), on the
endpoint it ran on (``home``: ``resume_affinity=on``) and with a hold for a full home
(``hold``: ``resume_hold_ms``, ``--resume-hold-ms``, :mod:`runtime.scheduling.resume_home`);
then ``paced`` with the lent-prefill rules (:mod:`runtime.scheduling.lent_prefill`): lent
slots only for prompts of at most ``--lend-max-prefill`` estimated tokens (``bounded``), lent
slots waiting only for the prefills within their limit (``exclusive``: ``lend_exclusive``),
the others steered away from lent prefills (``steered``: ``lend_steer``), all three
(``shaped``), and those with ``home``'s resume affinity and engines (``shaped-home``).
The take-back is the router's own (:mod:`runtime.scheduling.takeback`, driven by
:mod:`bench.sim_preempt`). The engines chunk their prefills as vLLM V1 does
(:mod:`bench.sim_engine`, ``--max-batched-tokens``, default vLLM's 2,048; 0: whole prefills,
as the simulator worker). Per seed it prints the flood phase's output tokens/s (within the
phase's duration) and each over FCFS's, the well-behaved tenants' interactive TTFT SLO
share, their worst TTFT p95 under the flood over their baseline, the preemptions (and how
many of them preempted a generation preempted before), the tokens the resumes re-prefilled
(and those their engines' caches held, in how many resumes), the resumes' pause p50 / p95,
the p95 of each pause over one prefill of its context and of its engine part (from the new
grant to the token) over the same, the share of the flooder's requests served (a bound on
lent prompts defers its long ones); then whether each arm meets issue #34's goals (tokens/s
>= 95% of FCFS's, SLO >= 99%, worst p95 <= 1.2x), and at the end on how many seeds.

Engine-side priority orders only the engine's waiting queue (vLLM preempts a running request
only when its blocks cannot grow, not modelled): the router's slots equal the engines'
sequences, so a request waits in an engine only for prefill budget, and ``prio`` differs
from ``off`` only with chunked prefill.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from bench.dispatch_sim import simulate_run
from bench.scenario import load
from bench.sim_engine import VLLM_BUDGET, EngineOptions
from bench.sim_report import flow_table, table
from runtime.scheduling.registry import preemption_names
from runtime.scheduling.settings import PoolSettings

if TYPE_CHECKING:
    from bench.dispatch_sim import _Run

GOAL_TPS, GOAL_SLO, GOAL_P95 = 0.95, 0.99, 1.2
ARMS = ("fcfs", "off", "prio", "on", "reserve", "pace", "paced", "cache", "home", "hold",
        "bounded", "exclusive", "steered", "shaped", "shaped-home")  # fmt: skip
CACHE_ARMS = ("cache", "home", "hold", "shaped-home")  # engines caching the resumes' tokens


def _seeds(text: str) -> list[int]:
    first, sep, last = text.partition("-")
    return list(range(int(first), int(last) + 1)) if sep else [int(v) for v in text.split(",")]


def measure(
    scenario_path: Path,
    size: str,
    seed: int,
    *,
    lend_reserve: int = 3,
    budget: int | None = VLLM_BUDGET,
    victim: str = "fair",
    pace_prefill_tps: float = 2500.0,
    resume_hold_ms: float = 100.0,
    lend_max_prefill: int = 192,
    arms: Sequence[str] = ARMS,
) -> dict[str, dict[str, float]]:
    """``{arm: {tps, slo, worst_p95, preemptions, repeated, reprefilled, pause_p50_ms,
    pause_p95_ms, pause_ratio, engine_ratio, flooder_served}}`` for each of ``arms`` (of
    :data:`ARMS`, module docstring); ``budget``: the engines' ``max_num_batched_tokens``
    (None: whole prefills)."""
    scenario = dataclasses.replace(load(scenario_path), seed=seed)
    phase_s = scenario.size(size).phase_duration_s
    out: dict[str, dict[str, float]] = {}
    pace = {"pace_prefill_tps": str(pace_prefill_tps)}
    paced = {**pace, "resume_first": "on"}
    home = {**paced, "resume_affinity": "on"}
    hold = {**home, "resume_hold_ms": str(resume_hold_ms)}
    bounded = {**paced, "lend_max_prefill": str(lend_max_prefill)}
    exclusive = {**paced, "lend_exclusive": "on"}
    steered = {**paced, "lend_steer": "on"}
    shaped = {**bounded, "lend_exclusive": "on", "lend_steer": "on"}
    specs: tuple[tuple[str, dict[str, str], bool, int], ...] = (
        ("fcfs", {"fairness": "fcfs"}, False, 0),
        ("off", {}, False, 0),
        ("prio", {"upstream_priority": "on"}, False, 0),
        ("on", {}, True, 0),
        ("reserve", {}, True, lend_reserve),
        ("pace", pace, True, lend_reserve),
        ("paced", paced, True, lend_reserve),
        ("cache", paced, True, lend_reserve),
        ("home", home, True, lend_reserve),
        ("hold", hold, True, lend_reserve),
        ("bounded", bounded, True, lend_reserve),
        ("exclusive", exclusive, True, lend_reserve),
        ("steered", steered, True, lend_reserve),
        ("shaped", shaped, True, lend_reserve),
        ("shaped-home", {**shaped, "resume_affinity": "on"}, True, lend_reserve),
    )
    for arm, policies, preempt, reserve in specs:
        if arm not in arms:
            continue
        settings = PoolSettings.from_policies(
            {k: v for k, v in policies.items() if k != "upstream_priority"}, ()
        )
        engine = EngineOptions(budget=budget, priority="upstream_priority" in policies,
                               resume_cache=arm in CACHE_ARMS)  # fmt: skip
        run = asyncio.run(simulate_run(scenario, settings, phase_s=phase_s, preempt=preempt,
                                       victim=victim, lend_reserve=reserve,
                                       engine=engine))  # fmt: skip
        out[arm] = summarise(run)
    return out


def summarise(run: _Run) -> dict[str, float]:
    """One arm's figures on one seed (:func:`measure`'s keys) from its finished run."""
    scenario = run.scenario
    last = scenario.phases[-1].name
    flow = flow_table(run)[f"{last} flow"]
    resumes, cached = run.resume_hits.get(last, [0, 0])
    ratios = [r["p95_over_baseline"] for k, r in table(scenario, run.outcomes).items()
              if k.startswith("ratio")]  # fmt: skip
    flooders = {t.name for t in scenario.tenants if t.flooding}
    flooded = [o for o in run.outcomes if o.phase == last and o.tenant in flooders]
    return {
        "tps": flow["tokens_per_s"] or 0.0,
        "slo": flow["slo_share"] or 0.0,
        "worst_p95": max((r for r in ratios if r is not None), default=float("nan")),
        "preemptions": flow["preemptions"] or 0.0,
        "repeated": flow["repeated"] or 0.0,
        "reprefilled": (flow["reprefilled"] or 0.0) - cached,
        "cached": float(cached),
        "cache_hits": float(resumes),
        "pause_p50_ms": flow["pause_p50_ms"] or 0.0,
        "pause_p95_ms": flow["pause_p95_ms"] or 0.0,
        "pause_ratio": flow["pause_over_prefill_p95"] or 0.0,
        "engine_ratio": flow["engine_over_prefill_p95"] or 0.0,
        "flooder_served": (sum(o.ttft_s is not None for o in flooded) / len(flooded)
                           if flooded else 1.0),
    }  # fmt: skip


def meets(row: dict[str, float], fcfs_tps: float) -> bool:
    """Whether an arm meets issue #34's goals on one seed."""
    return (row["tps"] >= GOAL_TPS * fcfs_tps and row["slo"] >= GOAL_SLO
            and row["worst_p95"] <= GOAL_P95)  # fmt: skip


def common_arguments(parser: argparse.ArgumentParser) -> None:
    """The options this sweep shares with :mod:`bench.preempt_bound`: ``--scenario``,
    ``--size``, ``--seeds`` and ``--max-batched-tokens``."""
    parser.add_argument("--scenario", type=Path, default=Path("bench/scenarios/contention.toml"))
    parser.add_argument("--size", default="full")
    parser.add_argument("--seeds", type=_seeds, default=_seeds("0-7"), help="e.g. 0-7 or 1,3")
    parser.add_argument(
        "--max-batched-tokens", type=int, default=VLLM_BUDGET, metavar="N",
        help="the engines' token budget per step (chunked prefill); 0: whole prefills",
    )  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.preempt_sweep")
    common_arguments(parser)
    parser.add_argument(
        "--lend-reserve", type=int, default=3, metavar="N",
        help="the reserve arm: lend only while more than N of the pool's slots are free",
    )  # fmt: skip
    parser.add_argument(
        "--victim", choices=[n for n in preemption_names() if n != "off"], default="fair",
        help="the victim choice of the on and reserve arms (runtime.scheduling.preempt)",
    )  # fmt: skip
    parser.add_argument(
        "--pace-prefill-tps", type=float, default=2500.0, metavar="TPS",
        help="the pace and paced arms' pace_prefill_tps (the engines prefill 5,000 tokens/s)",
    )  # fmt: skip
    parser.add_argument(
        "--resume-hold-ms", type=float, default=100.0, metavar="MS",
        help="the hold arm's resume_hold_ms (a resume waits this long for its full home)",
    )  # fmt: skip
    parser.add_argument(
        "--lend-max-prefill", type=int, default=192, metavar="TOKENS",
        help="the bounded and shaped arms' lend_max_prefill (lent prompts' estimated tokens)",
    )  # fmt: skip
    parser.add_argument(
        "--arms", default=",".join(ARMS), help=f"comma-separated, fcfs first; of {', '.join(ARMS)}"
    )
    args = parser.parse_args(argv)
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not arms or arms[0] != "fcfs" or any(a not in ARMS for a in arms):
        parser.error(f"--arms: fcfs first, then of {', '.join(ARMS)}")
    if min(args.lend_reserve, args.max_batched_tokens, args.resume_hold_ms,
           args.lend_max_prefill) < 0:  # fmt: skip
        parser.error("--lend-reserve, --max-batched-tokens, --resume-hold-ms and "
                     "--lend-max-prefill must be >= 0")  # fmt: skip
    budget = args.max_batched_tokens or None
    print(f"arms: fcfs, off (flood limit), prio (flood limit, engine priority), on (lend all), "
          f"reserve (lend, {args.lend_reserve} free slots kept), pace (reserve, lent "
          f"prefills paced at {args.pace_prefill_tps:g} tokens/s), paced (pace, resumes "
          f"first), cache (paced, engines with prefix caching: a resume prefills what its "
          f"engine does not hold), home (cache, resume_affinity=on), hold (home, "
          f"resume_hold_ms={args.resume_hold_ms:g}), bounded (paced, lend_max_prefill="
          f"{args.lend_max_prefill}), exclusive (paced, lend_exclusive=on), steered (paced, "
          f"lend_steer=on), shaped (bounded, exclusive and steered), shaped-home (shaped, "
          f"resume_affinity=on, engines as cache's); "
          f"victim {args.victim}; "
          f"engines: {f'chunked prefill, {budget} tokens a step' if budget else 'whole prefills'}"
          "; tokens/s (% of FCFS's), SLO share, worst p95 over baseline, preemptions "
          "(repeated), re-prefilled tokens, resume pause p50/p95 (ms), p95 of pause over one "
          "prefill of its context (and of the pause's engine part, from the new grant), "
          "the flooder's requests served of those it sent, goals met")  # fmt: skip
    met = dict.fromkeys(arms, 0)
    for seed in args.seeds:
        m = measure(args.scenario, args.size, seed, lend_reserve=args.lend_reserve,
                    budget=budget, victim=args.victim,
                    pace_prefill_tps=args.pace_prefill_tps,
                    resume_hold_ms=args.resume_hold_ms,
                    lend_max_prefill=args.lend_max_prefill, arms=arms)  # fmt: skip
        fcfs_tps = m["fcfs"]["tps"]
        for arm in arms:
            r = m[arm]
            met[arm] += meets(r, fcfs_tps)
            print(f"seed {seed}  {arm:8} {r['tps']:6.0f} ({r['tps'] / fcfs_tps:4.0%})  "
                  f"slo {r['slo']:.2f}  worst_p95 {r['worst_p95']:5.2f}  "
                  f"preempt {r['preemptions']:4.0f} ({r['repeated']:4.0f})  "
                  f"reprefilled {r['reprefilled']:6.0f} (hit {r['cached']:6.0f} in "
                  f"{r['cache_hits']:3.0f})  "
                  f"pause p50/p95 {r['pause_p50_ms']:5.0f}/{r['pause_p95_ms']:5.0f} ms "
                f"({r['pause_ratio']:5.1f}x, engine {r['engine_ratio']:4.1f}x)  "
                  f"flooder served {r['flooder_served']:.3f}  "
                  f"goals {'yes' if meets(r, fcfs_tps) else 'no'}", flush=True)  # fmt: skip
    print("goals met on " + ", ".join(f"{arm} {n}/{len(args.seeds)}" for arm, n in met.items()))


if __name__ == "__main__":
    main()
