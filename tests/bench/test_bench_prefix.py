"""The shared-prefix workload (bench/scenarios/prefix.toml) and the backends' prefix figures."""

from __future__ import annotations

import dataclasses
import itertools
import tomllib
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
import pytest
from aiohttp.test_utils import TestServer

from bench.loadgen import request_body
from bench.prefix_stats import prefix_counters, prefix_figures, reset_prefix_caches
from bench.scenario import ScenarioError, load, override, parse
from bench.targets import FACTORIES
from bench.workload import Planned, chat_messages, plan_phase, prompt_text
from runtime.routing.prefix import chat_block_hashes
from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.prefix_cache import render_chat, text_block_hashes
from runtime.workers.simulator.server import create_app
from runtime.workers.simulator.text import count_chat_tokens
from runtime.workers.simulator.timing import Capacity, TimingModel

pytestmark = pytest.mark.unit

SCENARIOS = Path(__file__).resolve().parents[2] / "bench" / "scenarios"


def _doc() -> dict[str, Any]:
    with (SCENARIOS / "prefix.toml").open("rb") as handle:
        return tomllib.load(handle)


def _plan(duration_s: float = 120.0) -> tuple[Any, tuple[Planned, ...]]:
    scenario = load(SCENARIOS / "prefix.toml")
    plan = plan_phase(scenario, scenario.phases[1], duration_s=duration_s, max_requests=100_000)
    return scenario, plan.requests


def _pairs(planned: Planned) -> list[tuple[str, str]]:
    return [(m["role"], m["content"]) for m in chat_messages(planned)]


def test_the_prefix_scenario_parses_with_known_targets():
    scenario = load(SCENARIOS / "prefix.toml")
    assert scenario.backends.count == 4
    assert scenario.prefix.enabled
    assert all(t.system_prompt_tokens >= 1000 for t in scenario.tenants)
    assert set(scenario.targets) <= set(FACTORIES)
    assert scenario.phases_for("smoke")


def test_requests_mix_unique_prompts_and_growing_conversations():
    scenario, requests = _plan()
    unique = [p for p in requests if not p.conversation]
    share = len(unique) / len(requests)
    assert share == pytest.approx(scenario.prefix.unique_share, abs=0.05)
    assert all(p.system_tokens == 0 and not p.history for p in unique)
    systems = {t.name: t.system_prompt_tokens for t in scenario.tenants}
    turns: dict[str, list[Planned]] = defaultdict(list)
    for p in requests:
        if p.conversation:
            assert p.system_tokens == systems[p.tenant]
            turns[p.conversation].append(p)
    longest = max(len(v) for v in turns.values())
    assert 2 < longest <= scenario.prefix.max_turns
    for conv in turns.values():
        for before, after in itertools.pairwise(conv):
            # The next turn's history is this turn plus its answer ...
            assert after.history == (*before.history, (before.user_tokens, before.max_tokens))
            # ... and its messages repeat this turn's, character for character.
            assert _pairs(after)[: len(_pairs(before))] == _pairs(before)
    for p in requests:
        assert p.prompt_tokens + p.max_tokens <= scenario.backends.max_model_len
        assert len(prompt_text(p)) == 4 * p.user_tokens


def test_turns_share_blocks_in_the_simulator_and_in_the_router_index():
    _, requests = _plan(duration_s=60.0)
    by_conv: dict[str, list[Planned]] = defaultdict(list)
    for p in requests:
        if p.conversation:
            by_conv[p.conversation].append(p)
    first, second = next(v for v in by_conv.values() if len(v) >= 2)[:2]
    sim = [text_block_hashes(render_chat(_pairs(p)), 16) for p in (first, second)]
    router = [chat_block_hashes(_pairs(p)) for p in (first, second)]
    for one, two in (sim, router):
        assert len(one) > 10
        assert two[: len(one)] == one
    tokens = count_chat_tokens([c for _, c in _pairs(first)])
    assert len(sim[0]) == tokens // 16


def test_scenarios_without_a_prefix_table_keep_unique_single_messages():
    scenario = load(SCENARIOS / "latency.toml")
    plan = plan_phase(scenario, scenario.phases[0], duration_s=2.0, max_requests=50)
    for p in plan.requests:
        assert not p.conversation
        assert p.user_tokens == p.prompt_tokens
        assert chat_messages(p) == [{"role": "user", "content": prompt_text(p)}]
    assert b'"role":"system"' not in request_body(plan.requests[0], "m")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("prefix.unique_share", 1.5, "unique_share"),
        ("prefix.conversations", 0, "conversations and max_turns"),
        ("prefix.max_turns", 0, "conversations and max_turns"),
        ("tenants.0.system_prompt_tokens", -1, "system_prompt_tokens"),
        ("tenants.0.system_prompt_tokens", 8000, "max_model_len"),
    ],
)
def test_bad_prefix_settings_are_refused(path: str, value: Any, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse(override(_doc(), path, value))


def test_prefix_targets_are_configured_as_named():
    affinity = FACTORIES["switchyard-prefix-affinity"]()
    scenario = load(SCENARIOS / "prefix.toml")
    assert affinity.policies(scenario)["scorers"] == "least_load,prefix_affinity"  # type: ignore[attr-defined]
    load_only = FACTORIES["switchyard-load-only"]()
    assert load_only.policies(scenario)["prefix_routing"] == "off"  # type: ignore[attr-defined]
    assert "prefix_routing" not in FACTORIES["switchyard"]().policies(scenario)  # type: ignore[attr-defined]
    assert FACTORIES["vllm-router-cache-aware"]().policy == "cache_aware"  # type: ignore[attr-defined]
    assert FACTORIES["vllm-router"]().policy == "round_robin"  # type: ignore[attr-defined]


def test_prefix_figures():
    figures = prefix_figures((100.0, 10.0), (1100.0, 610.0), reset=True)
    assert figures == {
        "queried_tokens": 1000.0, "hit_tokens": 600.0, "hit_rate": 0.6, "caches_reset": True,
    }  # fmt: skip
    assert prefix_figures((0.0, 0.0), (0.0, 0.0), reset=False)["hit_rate"] is None


@pytest.mark.asyncio
async def test_backends_are_reset_and_their_counters_read():
    config = SimulatorConfig(
        model="m",
        timing=TimingModel(prefill_tps=1e7, decode_a_ms=1, decode_b_ms=0),
        capacity=Capacity(max_num_seqs=4, kv_capacity_tokens=16384),
    )
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    backend = SimpleNamespace(base_url=f"http://127.0.0.1:{server.port}")
    body = {"model": "m", "messages": [{"role": "system", "content": "s" * 2000}],
            "max_tokens": 1}  # fmt: skip
    try:
        async with aiohttp.ClientSession() as session:
            for _ in range(2):
                async with session.post(f"{backend.base_url}/v1/chat/completions", json=body):
                    pass
            queries, hits = await prefix_counters(session, [backend])
            assert await reset_prefix_caches(session, [backend])
            async with session.post(f"{backend.base_url}/v1/chat/completions", json=body):
                pass
            after = await prefix_counters(session, [backend])
            gone = SimpleNamespace(base_url="http://127.0.0.1:9")
            assert not await reset_prefix_caches(session, [gone])
            assert await prefix_counters(session, [gone]) == (0.0, 0.0)
    finally:
        await server.close()
    tokens = count_chat_tokens(["s" * 2000])
    assert queries == 2 * tokens
    assert hits == (tokens // 16) * 16
    assert after == (3 * tokens, hits)  # the third request, after the reset, did not hit


@pytest.mark.timing
@pytest.mark.asyncio
async def test_calibration_recovers_the_simulators_prefill_rate():
    from bench.calibrate import calibrate  # noqa: PLC0415

    config = SimulatorConfig(
        model="m",
        timing=TimingModel(prefill_tps=20_000.0, decode_a_ms=2, decode_b_ms=0),
        capacity=Capacity(max_num_seqs=4, kv_capacity_tokens=16384),
    )
    server = TestServer(create_app(config), host="127.0.0.1")
    await server.start_server()
    try:
        result = await calibrate(
            f"http://127.0.0.1:{server.port}", "m", lengths=[256, 1024, 2048], repeats=2
        )
    finally:
        await server.close()
    assert result["prefill_tps"] == pytest.approx(20_000.0, rel=0.25)
    longest = result["points"][-1]
    assert longest["warm_ms"] < longest["cold_ms"] / 2  # the cached prompt skips its prefill
    assert result["prefix_cache"]["hit_tokens"] > 0


# -- bench.dispatch_sim with prefix caches ---------------------------------------------------
def _sim(routing: str) -> dict[str, dict[str, float | None]]:
    import asyncio  # noqa: PLC0415

    from bench.dispatch_sim import simulate_run  # noqa: PLC0415
    from bench.sim_report import prefix_table  # noqa: PLC0415
    from runtime.scheduling.settings import PoolSettings  # noqa: PLC0415

    scenario = load(SCENARIOS / "prefix.toml", {"phases.0.rate_rps": 16.0})
    scenario = dataclasses.replace(scenario, phases=scenario.phases[:1])
    settings = PoolSettings.from_policies({}, ())
    run = asyncio.run(simulate_run(scenario, settings, phase_s=20.0, routing=routing))  # type: ignore[arg-type]
    return prefix_table(run)


def test_prefix_routing_beats_load_only_in_virtual_time():
    load_only, prefix = _sim("load")["load-8 all"], _sim("prefix")["load-8 all"]
    assert load_only == _sim("load")["load-8 all"]  # it repeats exactly
    assert load_only["sticky_share"] == 0
    assert prefix["sticky_share"] > 0.5
    assert prefix["n"] == load_only["n"]
    assert prefix["hit_rate"] > load_only["hit_rate"] + 0.05  # type: ignore[operator]
    assert prefix["p50_ms"] < 0.8 * load_only["p50_ms"]  # type: ignore[operator]


def test_the_prefix_fleet_sticks_then_falls_back_to_load():
    from bench.prefix_placement import PrefixFleet  # noqa: PLC0415
    from runtime.routing.prefix import CHARS_PER_TOKEN, DEFAULT_BLOCK_CHARS  # noqa: PLC0415
    from runtime.routing.sticky import StickyRule  # noqa: PLC0415

    fleet = PrefixFleet(mode="prefix", now=lambda: 0.0, rule=StickyRule(stickiness=1.0))
    eps = [fleet.add(i, capacity=4) for i in (1, 2)]
    hashes = tuple(range(100, 120))  # 20 blocks
    block_tokens = DEFAULT_BLOCK_CHARS // CHARS_PER_TOKEN
    tokens = 20 * block_tokens + 10
    fleet.expect("a", hashes, tokens)
    first = fleet.choose(eps, "a")  # nothing cached: by load (the lower id on a tie)
    assert first.id == 1
    assert fleet.placer.queued_prefill(1) == tokens
    fleet.acquire(1)
    fleet.expect("b", hashes, tokens)
    # "a"'s whole prefill is still queued at 1: waiting for it costs more than the cache saves.
    assert fleet.choose(eps, "b").id == 2
    fleet.started(1, "a")
    fleet.expect("b2", hashes, tokens)
    assert fleet.choose(eps, "b2").id == 1  # sticks although endpoint 1 is busier
    assert fleet.placer.queued_prefill(1) == 10  # only the partial block is uncached
    # Endpoint 1's batch is full: load decides.
    for _ in range(3):
        fleet.acquire(1)
    fleet.expect("c", hashes, tokens)
    assert fleet.choose(eps, "c").id == 2
    assert (fleet.sticky, fleet.by_load) == (1, 3)
    assert fleet.choose(eps, None).id == 2  # no expectation: plain load choice


def test_dispatch_sim_command_takes_routing_and_sticky_parameters(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from bench.dispatch_sim import main  # noqa: PLC0415

    scenario = str(SCENARIOS / "prefix.toml")
    main(["--scenario", scenario, "--size", "smoke", "--routing", "prefix",
          "--sticky", "stickiness=3", "--sticky", "min_saved_tokens=128"])  # fmt: skip
    out = capsys.readouterr().out
    assert "routing prefix" in out
    assert "load-8 all" in out
    assert "hit_rate=" in out
    for bad in ("nope=1", "stickiness", "stickiness=x", "max_load=0"):
        with pytest.raises(SystemExit):
            main(["--scenario", scenario, "--routing", "prefix", "--sticky", bad])
    capsys.readouterr()


def test_the_old_byte_bound_token_estimate_costs_hit_rate_in_virtual_time():
    """The diagnosis of bench.prefix_diagnose: told each prompt's bytes as its tokens (the
    plan's bound without a tokenizer), the placer overrates queued prefill and lets
    conversations leave their engine; the rendering's estimate keeps them."""
    from bench.prefix_diagnose import byte_bound_tokens, replay_hit_rates  # noqa: PLC0415

    fixed = _sim("prefix")["load-8 all"]
    with byte_bound_tokens():
        inflated = _sim("prefix")["load-8 all"]
    assert _sim("prefix")["load-8 all"] == fixed  # the patch is gone after the block
    assert fixed["hit_rate"] > inflated["hit_rate"] + 0.03  # type: ignore[operator]
    assert fixed["sticky_share"] > inflated["sticky_share"] + 0.1  # type: ignore[operator]
    scenario = load(SCENARIOS / "prefix.toml", {"phases.0.rate_rps": 16.0})
    scenario = dataclasses.replace(scenario, phases=scenario.phases[:1])
    pinned = replay_hit_rates(scenario, 20.0)["load-8"]
    assert 0.8 < pinned < fixed["hit_rate"]  # type: ignore[operator]
