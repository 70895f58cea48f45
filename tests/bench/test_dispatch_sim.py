"""bench.dispatch_sim: the scheduler alone on a scenario's schedule, in virtual time."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from bench.dispatch_sim import main, simulate, simulate_run
from bench.preempt_sweep import main as sweep
from bench.preempt_sweep import measure
from bench.scenario import load
from bench.sim_engine import Engine, EngineOptions, Seq
from bench.sim_preempt import resumes
from bench.sim_report import Flow, flow_table, table
from bench.workload import Planned
from runtime.scheduling.settings import PoolSettings
from runtime.workers.simulator.timing import TimingModel

pytestmark = pytest.mark.unit

CONTENTION = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "contention.toml"


def run(**policies: str) -> dict[str, dict[str, float | None]]:
    scenario = load(CONTENTION)
    settings = PoolSettings.from_policies(policies, ())
    return table(scenario, asyncio.run(simulate(scenario, settings, phase_s=15.0)))


def test_it_repeats_exactly_and_every_request_gets_a_slot() -> None:
    first, second = run(), run()
    assert first == second
    assert all(row["failed"] == 0 for key, row in first.items() if not key.startswith("ratio"))
    assert first["baseline acme interactive"]["n"]


def test_fair_share_keeps_the_flood_off_the_well_behaved_tenants() -> None:
    def worst(rows: dict[str, dict[str, float | None]]) -> float:
        ratios = [r["p95_over_baseline"] for k, r in rows.items() if k.startswith("ratio")]
        assert ratios
        assert all(value is not None for value in ratios)
        return max(value for value in ratios if value is not None)

    # fcfs lets the flood land on everyone; vtc with headroom keeps it off (by a wide margin).
    assert 4 * worst(run(fairness="vtc")) < worst(run(fairness="fcfs"))


def test_the_command_prints_the_table_and_refuses_a_bad_policy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    main(["--scenario", str(CONTENTION), "--size", "smoke", "--policy", "headroom=0.5"])
    out = capsys.readouterr().out
    assert "policies {'headroom': '0.5'}" in out
    assert "ratio globex" in out
    with pytest.raises(SystemExit):
        main(["--scenario", str(CONTENTION), "--policy", "headroom"])
    assert "KEY=VALUE" in capsys.readouterr().err


def test_a_step_prefills_every_newcomer_and_slows_everyone_running() -> None:
    b = load(CONTENTION).backends  # prefill 5000 tok/s, decode 10 + 0.5 * batch ms
    timing = TimingModel(
        prefill_tps=b.prefill_tps, decode_a_ms=b.decode_a_ms, decode_b_ms=b.decode_b_ms
    )
    engine = Engine(running=[_seq(prompt_tokens=10)])
    assert engine.schedule(timing) == pytest.approx((10 + 0.5 * 1) / 1000)  # decode only
    engine.finish()
    engine.waiting = [_seq(prompt_tokens=500), _seq(prompt_tokens=1500)]
    assert engine.schedule(timing) == pytest.approx(2000 / 5000 + (10 + 0.5 * 3) / 1000)
    assert len(engine.finish()) == 3  # everyone has a token: the newcomers their first


def test_another_seed_plays_another_schedule(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--scenario", str(CONTENTION), "--size", "smoke"])
    default = capsys.readouterr().out
    main(["--scenario", str(CONTENTION), "--size", "smoke", "--seed", "7"])
    other = capsys.readouterr().out
    assert "ratio globex" in other
    assert other != default


def _seq(*, prompt_tokens: int, band: int = 0) -> Seq:
    planned = Planned(index=0, at=0.0, tenant="t", klass="interactive",
                      prompt_tokens=prompt_tokens, max_tokens=4, stream=True)  # fmt: skip
    return Seq(grant=None, planned=planned, arrived=0.0, left=4, band=band)  # type: ignore[arg-type]


def test_preemption_lends_slots_takes_them_back_and_counts_each_token_once() -> None:
    scenario = load(CONTENTION)
    settings = PoolSettings.from_policies({}, ())
    on = asyncio.run(simulate_run(scenario, settings, phase_s=2.5, preempt=True))
    off = asyncio.run(simulate_run(scenario, settings, phase_s=2.5))
    flood_on, flood_off = on.flow["flood"], off.flow["flood"]
    assert flood_off.preemptions == 0
    assert flood_on.preemptions > 0
    # every resume re-prefilled at least its prompt (and the tokens it had generated)
    assert flood_on.reprefilled > flood_on.preemptions * 8  # prompts are >= 8 tokens
    # each request's tokens are generated once, preempted or not: the same total either way
    plan = [o for o in on.outcomes if o.phase == "flood"]
    assert flood_on.tokens == flood_off.tokens
    assert len(plan) == len([o for o in off.outcomes if o.phase == "flood"])
    assert all(o.ttft_s is not None for o in plan)  # a preempted one keeps its first TTFT
    rows = flow_table(on)
    assert rows["flood flow"]["preemptions"] == flood_on.preemptions
    assert rows["flood flow"]["repeated"] == flood_on.repeated


def test_the_resume_accounting_counts_each_preemption_and_the_repeated_ones() -> None:
    flow, seq = Flow(), _seq(prompt_tokens=500)
    resumes(flow, seq, 520)
    assert (seq.prefill, seq.preempted, flow.preemptions, flow.repeated) == (520, 1, 1, 0)
    resumes(flow, seq, 540)
    assert (seq.prefill, seq.preempted, flow.preemptions, flow.repeated) == (540, 2, 2, 1)
    assert flow.reprefilled == 520 + 540


def test_a_lend_reserve_keeps_slots_free_for_the_others_so_fewer_preemptions() -> None:
    scenario = dataclasses.replace(load(CONTENTION), seed=1)
    settings = PoolSettings.from_policies({}, ())
    on = asyncio.run(simulate_run(scenario, settings, phase_s=2.5, preempt=True))
    kept = asyncio.run(simulate_run(scenario, settings, phase_s=2.5, preempt=True,
                                    lend_reserve=4))  # fmt: skip
    assert 0 < kept.flow["flood"].preemptions < on.flow["flood"].preemptions
    assert kept.flow["flood"].tokens == on.flow["flood"].tokens  # the same work, all of it


def test_a_resumed_generation_prefills_its_prompt_and_what_it_generated() -> None:
    b = load(CONTENTION).backends
    timing = TimingModel(
        prefill_tps=b.prefill_tps, decode_a_ms=b.decode_a_ms, decode_b_ms=b.decode_b_ms
    )
    resumed = _seq(prompt_tokens=500)
    resumed.generated, resumed.prefill = 100, 600
    engine = Engine(waiting=[resumed])
    assert engine.schedule(timing) == pytest.approx(600 / 5000 + (10 + 0.5 * 1) / 1000)


def test_the_command_takes_preempt_on(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--scenario", str(CONTENTION), "--size", "smoke", "--preempt", "on"])
    out = capsys.readouterr().out
    assert ", preempt on" in out
    assert "flood flow" in out
    assert "preemptions=" in out
    with pytest.raises(SystemExit):
        main(["--scenario", str(CONTENTION), "--preempt", "on", "--routing", "load"])
    with pytest.raises(SystemExit):
        main(["--scenario", str(CONTENTION), "--preempt", "on", "--lend-reserve", "-1"])


def test_the_sweep_compares_fcfs_the_flood_limit_and_preemption() -> None:
    m = measure(CONTENTION, "smoke", 1, lend_reserve=4)
    assert set(m) == {"fcfs", "off", "prio", "on", "reserve", "pace", "paced", "cache", "home",
                      "hold", "bounded", "exclusive", "steered", "shaped",
                      "shaped-home"}  # fmt: skip
    assert m["off"]["preemptions"] == m["fcfs"]["preemptions"] == 0
    assert m["on"]["preemptions"] > m["reserve"]["preemptions"] > 0
    assert all(row["tps"] > 0 and 0 < row["flooder_served"] <= 1 for row in m.values())


def test_the_sweep_plays_only_the_arms_asked_for(capsys: pytest.CaptureFixture[str]) -> None:
    assert set(measure(CONTENTION, "smoke", 1, arms=("fcfs", "pace"))) == {"fcfs", "pace"}
    with pytest.raises(SystemExit):
        sweep(["--scenario", str(CONTENTION), "--arms", "pace,fcfs"])  # fcfs first
    with pytest.raises(SystemExit):
        sweep(["--scenario", str(CONTENTION), "--arms", "fcfs,nope"])
    assert "--arms: fcfs first" in capsys.readouterr().err


def _timing() -> TimingModel:
    b = load(CONTENTION).backends  # prefill 5000 tok/s, decode 10 + 0.5 * batch ms
    return TimingModel(prefill_tps=b.prefill_tps, decode_a_ms=b.decode_a_ms,
                       decode_b_ms=b.decode_b_ms)  # fmt: skip


def test_chunked_prefill_decodes_first_and_cuts_a_long_prompt_to_the_budget() -> None:
    timing = _timing()
    decoding = [_seq(prompt_tokens=10) for _ in range(3)]
    engine = Engine(running=list(decoding), budget=2048)
    long, short = _seq(prompt_tokens=3000), _seq(prompt_tokens=100)
    engine.waiting = [long, short]
    # the three decodes take 3 tokens of the budget, the long prompt the other 2045
    assert engine.schedule(timing) == pytest.approx(2045 / 5000 + (10 + 0.5 * 4) / 1000)
    assert engine.waiting == [short]  # no budget left for it this step
    assert engine.finish() == decoding  # the long prompt has no token yet
    # next step: the decodes, the long prompt's last 955 tokens, then the short prompt whole
    assert engine.schedule(timing) == pytest.approx(1055 / 5000 + (10 + 0.5 * 5) / 1000)
    assert engine.finish() == [*decoding, long, short]


def test_a_budget_no_step_reaches_plays_exactly_the_whole_prefill_model() -> None:
    scenario = load(CONTENTION)
    settings = PoolSettings.from_policies({}, ())
    whole = asyncio.run(simulate_run(scenario, settings, phase_s=2.5))
    huge = asyncio.run(simulate_run(scenario, settings, phase_s=2.5,
                                    engine=EngineOptions(budget=10**9)))  # fmt: skip
    vllm = asyncio.run(simulate_run(scenario, settings, phase_s=2.5,
                                    engine=EngineOptions(budget=256)))  # fmt: skip
    assert huge.outcomes == whole.outcomes
    assert vllm.outcomes != whole.outcomes  # a budget steps reach does change the steps
    assert vllm.flow["flood"].tokens == whole.flow["flood"].tokens  # not the work


def test_engine_priority_orders_only_the_engines_waiting_queue() -> None:
    timing = _timing()
    batch, interactive = _seq(prompt_tokens=300, band=2), _seq(prompt_tokens=300, band=0)
    fifo = Engine(waiting=[batch, interactive], budget=400)
    fifo.schedule(timing)
    assert fifo.running == [batch, interactive]  # oldest first: the batch prompt whole
    assert fifo.finish() == [batch]
    batch, interactive = _seq(prompt_tokens=300, band=2), _seq(prompt_tokens=300, band=0)
    prio = Engine(waiting=[batch, interactive], budget=400, priority=True)
    prio.schedule(timing)
    assert prio.finish() == [interactive]  # the lower band first
    with pytest.raises(ValueError, match="budget"):
        EngineOptions(budget=0)


def test_a_resume_pause_is_recorded_against_one_prefill_of_its_context() -> None:
    scenario = dataclasses.replace(load(CONTENTION), seed=1)
    settings = PoolSettings.from_policies({}, ())
    on = asyncio.run(simulate_run(scenario, settings, phase_s=2.5, preempt=True,
                                  engine=EngineOptions(budget=2048)))  # fmt: skip
    flood = on.flow["flood"]
    assert 0 < len(flood.pauses) <= flood.preemptions
    # a resume cannot come back faster than it re-prefills its prompt and generated tokens,
    # and its engine part (from the new grant) is within its pause
    assert all(pause >= engine >= one > 0 for pause, one, engine in flood.pauses)
    assert any(pause > engine for pause, _, engine in flood.pauses)  # some waited for a slot
    row = flow_table(on)["flood flow"]
    ratio = row["pause_over_prefill_p95"]
    assert ratio is not None
    assert ratio >= 1.0


def test_the_routers_take_back_preempts_at_most_twice_per_generation() -> None:
    # the simulator drives runtime.scheduling.takeback: its MAX_PREEMPTIONS holds
    scenario = dataclasses.replace(load(CONTENTION), seed=1)
    settings = PoolSettings.from_policies({}, ())
    on = asyncio.run(simulate_run(scenario, settings, phase_s=2.5, preempt=True))
    flood = on.flow["flood"]
    assert flood.preemptions > 0
    assert flood.repeated <= flood.preemptions // 2  # a repeat needs a first, at most one


def test_resume_first_and_paced_lending_shorten_the_pause_and_keep_the_work() -> None:
    scenario = dataclasses.replace(load(CONTENTION), seed=1)
    plain = PoolSettings.from_policies({}, ())
    paced = PoolSettings.from_policies({"pace_prefill_tps": "2500", "resume_first": "on"}, ())
    runs = [asyncio.run(simulate_run(scenario, s, phase_s=5.0, preempt=True, lend_reserve=3,
                                     engine=EngineOptions(budget=2048)))
            for s in (plain, paced)]  # fmt: skip
    before, after = (flow_table(r)["flood flow"] for r in runs)
    assert after["tokens"] == before["tokens"]  # every token generated once either way
    assert 0 < (after["preemptions"] or 0) <= (before["preemptions"] or 0)
    assert (after["pause_p95_ms"] or 0) < (before["pause_p95_ms"] or 0)
