"""bench.preempt_bound: the oracle arms that bound issue #34's goals, in virtual time."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from bench.dispatch_sim import simulate_run
from bench.preempt_bound import OracleEngine, bound, main, run_arm
from bench.scenario import load
from bench.sim_engine import EngineOptions, Seq
from bench.workload import Planned
from runtime.scheduling.settings import PoolSettings
from runtime.workers.simulator.timing import TimingModel

pytestmark = pytest.mark.unit

CONTENTION = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "contention.toml"
TIMING = TimingModel(prefill_tps=5000.0, decode_a_ms=10.0, decode_b_ms=0.5)


def _seq(prompt_tokens: int) -> Seq:
    planned = Planned(index=0, at=0.0, tenant="t", klass="interactive",
                      prompt_tokens=prompt_tokens, max_tokens=4, stream=True)  # fmt: skip
    return Seq(grant=None, planned=planned, arrived=0.0, left=4)  # type: ignore[arg-type]


def test_a_yielding_engine_keeps_the_background_prefill_out_of_a_foreground_prefill_step() -> None:
    decoding, flood_prompt, newcomer = _seq(10), _seq(1000), _seq(200)
    engine = OracleEngine(running=[decoding], budget=2048, yields=True, bg_chunk=64)
    engine.background = {decoding, flood_prompt}
    engine.waiting = [flood_prompt, newcomer]  # the flooder's was granted first
    # the newcomer's prefill goes first; the flooder decodes but does not prefill beside it
    assert engine.schedule(TIMING) == pytest.approx(200 / 5000 + (10 + 0.5 * 2) / 1000)
    assert engine.waiting == [flood_prompt]
    assert set(engine.finish()) == {decoding, newcomer}
    # a step with no foreground prefill: the flooder's prompt, at most 64 tokens of it
    assert engine.schedule(TIMING) == pytest.approx(64 / 5000 + (10 + 0.5 * 3) / 1000)
    assert set(engine.finish()) == {decoding, newcomer}  # its prompt is not done yet


def test_phantom_sequences_make_every_step_a_full_batch_and_keep_the_engine_busy() -> None:
    engine = OracleEngine(running=[_seq(10)], fill=16)
    assert engine.schedule(TIMING) == pytest.approx((10 + 0.5 * 16) / 1000)
    assert engine.phantoms == 15
    engine.finish()
    engine.running = []
    assert engine.schedule(TIMING) == pytest.approx((10 + 0.5 * 16) / 1000)  # idle: phantoms
    engine.fill = 0
    assert engine.schedule(TIMING) is None


def test_the_oracles_drop_preempt_for_free_or_queue_the_flooder() -> None:
    scenario = dataclasses.replace(load(CONTENTION), seed=1)
    runs = {arm: run_arm(scenario, arm, phase_s=2.5) for arm in ("alone", "free", "queue")}
    alone = [o for o in runs["alone"].outcomes if o.phase == "flood"]
    assert alone
    assert all(o.tenant != "floodco" for o in alone)
    free, queue = runs["free"].flow["flood"], runs["queue"].flow["flood"]
    assert free.preemptions > 0
    assert free.reprefilled == 0  # a victim keeps what it prefilled
    assert queue.preemptions == 0
    for run in runs.values():  # every well-behaved request gets its first token
        assert all(o.ttft_s is not None for o in run.outcomes if o.tenant != "floodco")
    assert runs["free"].flow["flood"].tokens > runs["alone"].flow["flood"].tokens


def test_a_free_resume_prefills_only_what_the_victim_had_not() -> None:
    scenario = dataclasses.replace(load(CONTENTION), seed=1)
    settings = PoolSettings.from_policies({}, ())
    paid, free = (
        asyncio.run(simulate_run(scenario, settings, phase_s=2.5, preempt=True,
                                 engine=EngineOptions(budget=2048, free_resume=option)))
        for option in (False, True)
    )  # fmt: skip
    assert free.flow["flood"].preemptions > 0
    assert free.flow["flood"].reprefilled < paid.flow["flood"].reprefilled


def test_the_bound_is_the_best_busy_oracle_at_95_percent_of_fcfs_tokens() -> None:
    row = {"slo": 1.0, "preemptions": 0.0}
    rows = {
        "fcfs": {**row, "tps": 1000.0, "worst_p95": 9.0},
        "alone": {**row, "tps": 500.0, "worst_p95": 0.5},  # not busy
        "yield": {**row, "tps": 990.0, "worst_p95": 1.4},
        "yield16": {**row, "tps": 900.0, "worst_p95": 1.0},  # under 95 %
        "yield64": {**row, "tps": 960.0, "worst_p95": 1.1},
        "paced-free+yield64": {**row, "tps": 990.0, "worst_p95": 0.9},  # the router's
    }
    assert bound(rows) == ("yield64", 1.1)
    assert bound({"fcfs": rows["fcfs"]}) is None


def test_the_command_prints_each_arm_and_the_bound(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--scenario", str(CONTENTION), "--size", "smoke", "--seeds", "0",
          "--arms", "fcfs,full,yield64"])  # fmt: skip
    out = capsys.readouterr().out
    assert "seed 0  yield64" in out
    assert "bound at >= 95%" in out
    assert "goals met on fcfs" in out
    with pytest.raises(SystemExit):
        main(["--scenario", str(CONTENTION), "--arms", "off,free"])  # fcfs must come first
    assert "fcfs first" in capsys.readouterr().err
