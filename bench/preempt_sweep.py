"""Preemption against the flood limit and FCFS, over several schedules, in virtual time.

``python -m bench.preempt_sweep [--seeds 0-7] [--size full]`` plays the contention scenario
(:mod:`bench.dispatch_sim`) per seed three ways: FCFS (``fairness=fcfs``), the flood limit
(default policies, ``--preempt off``) and the flood limit lending idle slots and taking them
back by preemption (``--preempt on``). Per seed it prints the flood phase's output tokens/s
(within the phase's duration) and each over FCFS's, the well-behaved tenants' interactive
TTFT SLO share, their worst TTFT p95 under the flood over their baseline, the preemptions and
the tokens the resumes re-prefilled; then whether each seed meets issue #34's goals
(tokens/s >= 95% of FCFS's, SLO >= 99%, worst p95 <= 1.2x).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
from collections.abc import Sequence
from pathlib import Path

from bench.dispatch_sim import simulate_run
from bench.sim_report import flow_table, table
from bench.scenario import load
from runtime.scheduling.settings import PoolSettings

GOAL_TPS, GOAL_SLO, GOAL_P95 = 0.95, 0.99, 1.2


def _seeds(text: str) -> list[int]:
    first, sep, last = text.partition("-")
    return list(range(int(first), int(last) + 1)) if sep else [int(v) for v in text.split(",")]


def measure(scenario_path: Path, size: str, seed: int) -> dict[str, dict[str, float]]:
    """``{"fcfs" | "off" | "on": {tps, slo, worst_p95, preemptions, reprefilled}}``."""
    scenario = dataclasses.replace(load(scenario_path), seed=seed)
    phase_s = scenario.size(size).phase_duration_s
    flood = scenario.phases[-1].name
    out: dict[str, dict[str, float]] = {}
    for mode, policies, preempt in (("fcfs", {"fairness": "fcfs"}, False), ("off", {}, False),
                                    ("on", {}, True)):  # fmt: skip
        settings = PoolSettings.from_policies(policies, ())
        run = asyncio.run(simulate_run(scenario, settings, phase_s=phase_s, preempt=preempt))
        flow = flow_table(run)[f"{flood} flow"]
        ratios = [r["p95_over_baseline"] for k, r in table(scenario, run.outcomes).items()
                  if k.startswith("ratio")]  # fmt: skip
        out[mode] = {
            "tps": flow["tokens_per_s"] or 0.0,
            "slo": flow["slo_share"] or 0.0,
            "worst_p95": max((r for r in ratios if r is not None), default=float("nan")),
            "preemptions": flow["preemptions"] or 0.0,
            "reprefilled": flow["reprefilled"] or 0.0,
        }
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.preempt_sweep")
    parser.add_argument("--scenario", type=Path, default=Path("bench/scenarios/contention.toml"))
    parser.add_argument("--size", default="full")
    parser.add_argument("--seeds", type=_seeds, default=_seeds("0-7"), help="e.g. 0-7 or 1,3")
    args = parser.parse_args(argv)
    print("seed  fcfs_tps  off_tps(%fcfs)  on_tps(%fcfs)  slo off/on   worst_p95 off/on  "
          "preempt  reprefilled  goals off/on")  # fmt: skip
    for seed in args.seeds:
        m = measure(args.scenario, args.size, seed)
        fcfs, off, on = m["fcfs"], m["off"], m["on"]

        def met(r: dict[str, float], fcfs_tps: float = fcfs["tps"]) -> str:
            ok = (r["tps"] >= GOAL_TPS * fcfs_tps and r["slo"] >= GOAL_SLO
                  and r["worst_p95"] <= GOAL_P95)  # fmt: skip
            return "yes" if ok else "no"

        print(f"{seed:4}  {fcfs['tps']:8.0f}  {off['tps']:5.0f} ({off['tps'] / fcfs['tps']:4.0%})"
              f"    {on['tps']:5.0f} ({on['tps'] / fcfs['tps']:4.0%})  "
              f"{off['slo']:.2f}/{on['slo']:.2f}   {off['worst_p95']:5.2f}/{on['worst_p95']:5.2f}"
              f"       {on['preemptions']:6.0f}  {on['reprefilled']:11.0f}  "
              f"{met(off)}/{met(on)}")  # fmt: skip


if __name__ == "__main__":
    main()
