"""bench.prefix_ttft (a TTFT's parts in virtual time) and bench.prefix_cpu's profile diff."""

from __future__ import annotations

import cProfile
import dataclasses
from pathlib import Path
from typing import Any

import pytest

from bench.prefix_cpu import own_time, profile_diff
from bench.prefix_ttft import Parts, check_way, decompose, floor_p50, harness_view, main, summary
from bench.scenario import Scenario, load
from runtime.routing.sticky import StickyRule
from runtime.scheduling.settings import PoolSettings

pytestmark = pytest.mark.unit

SCENARIO = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "prefix.toml"


def _eight() -> Scenario:
    scenario = load(SCENARIO)
    return dataclasses.replace(scenario, phases=scenario.phases[:1])  # load-8 only


def test_the_parts_add_up_to_each_ttft_and_no_way_beats_the_floor():
    scenario = _eight()
    settings = PoolSettings.from_policies({}, ())
    p50s = {}
    for way in ("load", "prefix", "oracle", "score:1", "prefix-light"):
        parts = decompose(scenario, settings, 20.0, way, StickyRule())["load-8"]
        assert len(parts) > 100
        for p in parts:
            total = p.queue + p.wait_pf + p.wait_dec + p.own + p.others + p.decode
            assert total == pytest.approx(p.ttft, abs=1e-9)
            assert min(p.queue, p.wait_pf, p.wait_dec, p.own, p.others) >= 0
        p50s[way], _, every, middle = summary(parts)
        assert every["decode"] >= 10.0  # decode_a_ms: every first token ends a step
        assert middle["own"] > 0
    # The prefix-aware placer saves own prefill; the floor is below every placement.
    assert p50s["prefix"] < 0.85 * p50s["load"]
    floor = floor_p50(scenario, 20.0, "load-8")
    assert floor < min(p50s.values())
    assert floor > 0.6 * p50s["load"]  # the scenario's schedule: -35 % is out of reach


def test_the_prefix_way_is_the_routers_placement():
    """``prefix`` through the decomposing run places as bench.dispatch_sim does."""
    import asyncio  # noqa: PLC0415

    from bench.dispatch_sim import simulate_run  # noqa: PLC0415
    from bench.sim_report import prefix_table  # noqa: PLC0415

    scenario = _eight()
    settings = PoolSettings.from_policies({}, ())
    parts = decompose(scenario, settings, 20.0, "prefix", None)["load-8"]
    run = asyncio.run(simulate_run(scenario, settings, phase_s=20.0, routing="prefix"))
    row = prefix_table(run)["load-8 all"]
    assert row["n"] == len(parts)
    assert summary(parts)[0] == pytest.approx(row["p50_ms"], abs=1.0)


def test_ways_and_arguments_are_checked(capsys: pytest.CaptureFixture[str]) -> None:
    assert check_way("score:1.5") == "score:1.5"
    for bad in ("nope", "score", "score:x", "score:-1"):
        with pytest.raises(ValueError, match="unknown way"):
            check_way(bad)
    for argv in (["--ways", "load,best"], ["--seeds", "a"], ["--phase", "load-99"],
                 ["--policy", "prefix_hold_ms=-1"]):  # fmt: skip
        with pytest.raises(SystemExit):
            main(["--scenario", str(SCENARIO), "--size", "smoke", *argv])
    capsys.readouterr()


def test_the_command_prints_ratios_and_the_floor(capsys: pytest.CaptureFixture[str]) -> None:
    main(["--scenario", str(SCENARIO), "--size", "smoke", "--ways", "load,prefix"])
    out = capsys.readouterr().out
    assert "load-8: TTFT p50 over load's" in out
    assert "floor" in out
    assert "wait_dec" in out


def _busy(n: int) -> int:
    return sum(i * i for i in range(n))


def test_the_profile_diff_names_what_runs_only_on_one_side(tmp_path: Path) -> None:
    stats = {}
    for name, work in (("on", 200_000), ("off", 0)):
        profiler = cProfile.Profile()
        profiler.enable()
        _busy(work)
        profiler.disable()
        stats[name] = tmp_path / f"{name}.prof"
        profiler.dump_stats(str(stats[name]))
    on, off = own_time(stats["on"]), own_time(stats["off"])
    lines = profile_diff(on, off, 10, 10, top=3)
    assert lines[0].startswith("profiled own time per request: on ")
    first = lines[2]
    assert "_busy" in first or "genexpr" in first
    assert float(first.split()[0]) > 0  # more own time with "on"


def test_fresh_rounds_send_prompts_no_earlier_round_sent():
    from bench.prefix_cpu import fresh_plan  # noqa: PLC0415
    from bench.workload import chat_messages, plan_phase  # noqa: PLC0415
    from runtime.routing.prefix import chat_block_hashes  # noqa: PLC0415

    scenario = load(SCENARIO.with_name("latency.toml"))
    phase = next(p for p in scenario.phases if p.name == "unloaded")

    def blocks(requests: tuple[Any, ...]) -> set[int]:
        pairs = ([(m["role"], m["content"]) for m in chat_messages(p)] for p in requests)
        return {h for messages in pairs for h in chat_block_hashes(messages)}

    first = plan_phase(scenario, phase, duration_s=10.0, max_requests=100_000).requests
    replayed = plan_phase(
        dataclasses.replace(scenario, seed=scenario.seed + 1), phase, duration_s=10.0,
        max_requests=100_000,
    ).requests  # fmt: skip
    assert blocks(first) & blocks(replayed)  # another seed alone: request k repeats its blocks
    fresh = fresh_plan(scenario, phase, 10.0, 1).requests
    assert len(fresh) == len(replayed)
    assert blocks(fresh)
    assert not blocks(first) & blocks(fresh)


def test_the_harness_view_counts_only_what_the_drain_lets_finish():
    """Past capacity the harness cancels what is unanswered ``drain_s`` after the last send:
    the TTFT p50 is over the survivors, goodput over the phase's length."""

    def one(ttft: float, done: float) -> Parts:
        return Parts(ttft, ttft, 0.0, 0.0, 0.0, 0.0, 0.0, done=done)

    rows = [one(0.1, 5.0), one(0.4, 50.0), one(2.0, 70.0), one(30.0, 95.0), one(40.0, 99.0)]
    counted = harness_view(rows, sent=6, phase_s=60.0, drain_s=30.0, slo_ms=500.0)
    assert (counted.ok, counted.sent) == (3, 6)  # done by 90 s
    assert counted.p50_ms == pytest.approx(400.0)  # of 0.1, 0.4, 2.0 s
    assert counted.goodput_rps == pytest.approx(2 / 60.0)
    assert counted.served_rps == pytest.approx(2 / 60.0)  # done within the phase
    assert check_way("prefix-arrival") == "prefix-arrival"
