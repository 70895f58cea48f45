"""The harness's pure parts: scenario validation, overrides, schedules, fairness figures."""

from __future__ import annotations

import copy
import os
import tomllib
from pathlib import Path
from typing import Any

import pytest

from bench.__main__ import main
from bench.idle_cpu import cpu_ns, summary
from bench.metrics import maxmin_allocation, percentile
from bench.report import analyse
from bench.scenario import ScenarioError, coerce, load, override, parse
from bench.sweep import metric_of
from bench.workload import plan_phase, prompt_text, tenant_rates

pytestmark = pytest.mark.unit

SCENARIOS = Path(__file__).resolve().parents[2] / "bench" / "scenarios"


def _doc(name: str = "contention") -> dict[str, Any]:
    with (SCENARIOS / f"{name}.toml").open("rb") as handle:
        return tomllib.load(handle)


@pytest.mark.parametrize("name", ["latency", "contention"])
def test_shipped_scenarios_parse(name: str) -> None:
    scenario = load(SCENARIOS / f"{name}.toml")
    assert scenario.name == name
    assert scenario.capacity_rps() > 0
    assert scenario.phases_for("smoke")


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        ("seed", "x", "seed"),
        ("tenants.0.classes", {"nope": 1.0}, "unknown or no classes"),
        ("tenants.0.weight", 0.0, "weight must be > 0"),
        ("lengths.prompt.min", 0, "1 <= min <= max"),
        ("backends.kind", "gpu-magic", "simulator|vllm"),
        ("backends.kind", "vllm", "model_path"),
        ("arrivals.burst_factor", 0.5, "burst_factor >= 1"),
        ("phases.0.rate_rps", 3.0, "exactly one of rate_rps and load_factor"),
        ("stream_share", 1.5, "stream_share"),
        ("report.flood_phase", "nope", "no phase named"),
        ("sizes.smoke.phase_duration_s", 0, "durations must be > 0"),
    ],
)
def test_bad_scenarios_are_refused_with_the_field(path: str, value: Any, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse(override(_doc(), path, value))


def test_missing_size_is_refused() -> None:
    doc = _doc()
    del doc["sizes"]["full"]
    with pytest.raises(ScenarioError, match="missing"):
        parse(doc)


def test_unknown_size_is_refused() -> None:
    with pytest.raises(ScenarioError, match="no size 'huge'"):
        parse(_doc()).size("huge")


def test_override_sets_nested_paths_and_copies() -> None:
    doc = _doc()
    original = copy.deepcopy(doc)
    changed = override(doc, "switchyard.policies.fairness", "fcfs")
    assert changed["switchyard"]["policies"]["fairness"] == "fcfs"
    assert override(doc, "tenants.1.weight", 3.0)["tenants"][1]["weight"] == 3.0
    assert doc == original
    with pytest.raises(ScenarioError, match="not an index"):
        override(doc, "tenants.9.weight", 1.0)
    with pytest.raises(ScenarioError, match="goes inside"):
        override(doc, "seed.deeper", 1)


def test_coerce_types_like_toml() -> None:
    assert coerce("true") is True
    assert coerce("64") == 64
    assert coerce("0.5") == 0.5
    assert coerce("vtc") == "vtc"
    assert coerce("nan") == "nan"


def test_schedule_is_deterministic_and_open_loop() -> None:
    scenario = load(SCENARIOS / "contention.toml")
    flood = scenario.phases[1]
    one = plan_phase(scenario, flood, duration_s=20.0, max_requests=100_000)
    two = plan_phase(scenario, flood, duration_s=20.0, max_requests=100_000)
    assert one == two
    assert all(a.at <= b.at for a, b in zip(one.requests, one.requests[1:], strict=False))
    assert one.load_factor == pytest.approx(2.0)
    # Poisson with bursts keeps the mean rate: within 20% over 20 s at ~28 req/s.
    assert len(one.requests) == pytest.approx(one.offered_rps * 20.0, rel=0.2)
    cut = plan_phase(scenario, flood, duration_s=20.0, max_requests=10)
    assert cut.truncated
    assert len(cut.requests) == 10


def test_flooding_tenant_takes_the_extra_load_only() -> None:
    scenario = load(SCENARIOS / "contention.toml")
    base, flood = (tenant_rates(scenario, p) for p in scenario.phases)
    for tenant in ("acme", "globex", "initech"):
        assert flood[tenant] == pytest.approx(base[tenant])
    assert sum(flood.values()) == pytest.approx(2.0 * scenario.capacity_rps())
    assert flood["floodco"] > 10 * base["floodco"]


def test_prompt_text_has_the_planned_size_and_is_unique() -> None:
    scenario = load(SCENARIOS / "latency.toml")
    plan = plan_phase(scenario, scenario.phases[0], duration_s=2.0, max_requests=50)
    texts = [prompt_text(p) for p in plan.requests]
    assert all(len(t) == 4 * p.prompt_tokens for t, p in zip(texts, plan.requests, strict=True))
    assert len(set(texts)) == len(texts)


def test_maxmin_allocation_respects_small_demands() -> None:
    alloc = maxmin_allocation({"a": 10.0, "b": 100.0, "c": 100.0}, dict.fromkeys("abc", 1.0), 90)
    assert alloc == pytest.approx({"a": 10.0, "b": 40.0, "c": 40.0})
    weighted = maxmin_allocation({"a": 100.0, "b": 100.0}, {"a": 3.0, "b": 1.0}, 40)
    assert weighted == pytest.approx({"a": 30.0, "b": 10.0})


def test_percentile_interpolates() -> None:
    assert percentile([], 50) is None
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == pytest.approx(2.5)
    assert percentile([5.0], 99) == 5.0


def test_metric_of_reads_dotted_numbers_only() -> None:
    figures = {"ttft_ms": {"p99": 12.5}, "classes": {"x": {"ok": True}}}
    assert metric_of(figures, "ttft_ms.p99") == 12.5
    assert metric_of(figures, "ttft_ms.p50") is None
    assert metric_of(figures, "classes.x.ok") is None
    assert metric_of(None, "ttft_ms.p99") is None


def _fig(rps: float, p50: float, p99: float, *, cores: float | None, lag: float = 1.0) -> Any:
    return {
        "achieved_rps": rps,
        "error_rate": 0.0,
        "ttft_ms": {"p50": p50, "p99": p99},
        "e2e_ms": {"p50": p50, "p99": p99},
        "client_saturated": lag > 10.0,
        "usage": None if cores is None else {"cores_used": cores},
        "rps_per_cpu_core_used": None if cores is None else rps / cores,
    }


def test_comparisons_are_between_targets_of_the_run() -> None:
    phases = {
        "low": {"offered_rps": 10.0, "targets": {
            "direct": _fig(10, 5, 20, cores=None),
            "bare-proxy": _fig(10, 6, 22, cores=0.01),
            "switchyard": _fig(10, 7, 25, cores=0.02),
        }},
        "high": {"offered_rps": 100.0, "targets": {
            "direct": _fig(100, 5, 20, cores=None),
            "bare-proxy": _fig(100, 6, 24, cores=0.1),
            "switchyard": _fig(100, 9, 45, cores=0.25),
        }},
        "jammed": {"offered_rps": 400.0, "targets": {
            "direct": _fig(400, 5, 900, cores=None, lag=300.0),
            "bare-proxy": _fig(400, 6, 999, cores=0.3, lag=300.0),
            "switchyard": _fig(400, 50, 5000, cores=0.5, lag=300.0),
        }},
    }  # fmt: skip
    targets = {n: {"status": "ran", "info": {"cpus": [1]}} for n in ("bare-proxy", "switchyard")}
    scenario = load(SCENARIOS / "latency.toml")
    result = analyse(scenario, targets, phases)
    added = result["comparisons"]["added_latency"]
    assert added["low"]["switchyard"]["added_ttft_p50_ms"] == pytest.approx(2.0)
    assert added["low"]["switchyard"]["ratio_ttft_p99"] == pytest.approx(1.25)
    assert added["jammed"]["switchyard"]["trustworthy"] is False
    per_core = result["comparisons"]["rps_per_core"]
    # Over the 10 ms budget at "high", and "jammed" says nothing: the limit is "low".
    assert per_core["switchyard"]["phase"] == "low"
    assert per_core["switchyard"]["lower_bound"] is False
    assert per_core["bare-proxy"]["lower_bound"] is True
    goal = result["goals"]["rps_per_core_vs_bare_proxy"]
    # The bare proxy's figure is a lower bound: CPU cost per request at "high" decides.
    assert goal["basis"] == "requests per CPU core used at high"
    assert goal["measured"] == pytest.approx(0.4)
    assert result["goals"]["added_ttft_p99_ms_unloaded"]["measured"] == pytest.approx(5.0)
    assert result["goals"]["interactive_slo_attainment_under_flood"]["measured"] is None


def test_cli_refuses_unknown_targets_and_bad_scenarios(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="unknown targets: nope"):
        main(["run", "--scenario", str(SCENARIOS / "latency.toml"), "--targets", "nope"])
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n')
    with pytest.raises(SystemExit, match="missing"):
        main(["run", "--scenario", str(bad)])
    saved = tmp_path / "report.json"
    saved.write_text('{"phases": {}, "targets": {}}')
    with pytest.raises(SystemExit, match="holds no scenario"):
        main(["report", str(saved)])


def test_the_switchyard_target_snapshot_is_what_the_router_accepts() -> None:
    from bench.runner import new_key  # noqa: PLC0415
    from bench.targets.switchyard import POOL, build_snapshot  # noqa: PLC0415
    from runtime.gateway.auth import authenticate  # noqa: PLC0415
    from runtime.snapshot import decode, encode  # noqa: PLC0415

    scenario = load(SCENARIOS / "contention.toml")
    keys = {t.name: new_key() for t in scenario.tenants}
    urls = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    snap = decode(encode(build_snapshot(scenario, urls, keys, {"fairness": "fcfs"})))
    for tenant, key in keys.items():
        principal = authenticate(snap, key, now=0.0)
        assert principal.tenant.slug == tenant
        assert principal.tenant.default_class == next(iter(scenario.classes))
    assert [e.base_url for e in snap.endpoints.values()] == urls
    assert snap.pools[POOL].policies == {"fairness": "fcfs"}
    [model] = snap.models.values()
    assert model.name == scenario.backends.model
    assert snap.versions[model.versions[-1]].runtime in {"simulator", "vllm"}
    assert set(snap.classes) == set(scenario.classes)


def test_kv_events_backends_publish_and_only_the_precise_snapshot_announces_them() -> None:
    import json  # noqa: PLC0415

    from bench.backends import backend_argv  # noqa: PLC0415
    from bench.targets.switchyard import build_snapshot  # noqa: PLC0415

    scenario = load(SCENARIOS / "prefix.toml")
    assert scenario.backends.kv_events
    argv = backend_argv(scenario.backends, 8001, 0, 9001)
    assert argv[argv.index("--kv-events-endpoint") + 1] == "tcp://127.0.0.1:9001"
    assert "--kv-events-endpoint" not in backend_argv(scenario.backends, 8001, 0)
    vllm = parse({**_doc("prefix"), "backends": {"kind": "vllm", "count": 1, "model": "m",
                                                "model_path": "/m"}}).backends  # fmt: skip
    config = backend_argv(vllm, 8001, 0, 9001)
    assert json.loads(config[config.index("--kv-events-config") + 1])["endpoint"] == "tcp://*:9001"
    urls, events = ["http://127.0.0.1:1"], ["tcp://127.0.0.1:9001"]
    precise = build_snapshot(scenario, urls, {}, {}, events)
    assert [e.kv_events for e in precise.endpoints.values()] == events
    assert [e.kv_events for e in build_snapshot(scenario, urls, {}, {}).endpoints.values()] == [""]


def test_a_second_router_worker_gets_the_core_below_and_clients_keep_off_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from bench import runner  # noqa: PLC0415 - the module under test, imported where used
    from bench.procs import extra_router_cpus  # noqa: PLC0415
    from bench.targets.switchyard import worker_cpus  # noqa: PLC0415

    assert extra_router_cpus((7,), 1) == (6,)
    assert extra_router_cpus((7,), 0) == ()
    assert extra_router_cpus((), 1) == ()
    assert worker_cpus((7,), 2) == (7, 6)
    assert worker_cpus((7,), 1) == (7,)
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda _pid: set(range(8)))
    assert runner.client_cpus((7,)) == (0, 1, 2, 3, 4, 5)  # 6 is the second worker's
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda _pid: set(range(6)))
    assert runner.client_cpus((7,)) == (0, 1, 2, 3, 4, 5)  # pinned already: the same set
    monkeypatch.setattr(runner.os, "sched_getaffinity", lambda _pid: {0, 1})
    assert runner.client_cpus((1,)) == (0,)  # two cores: a second worker shares core 0


def test_the_ttft_slo_is_judged_on_streams_and_per_tenant() -> None:
    """A unary answer's "TTFT" is its whole generation: it does not count against the TTFT
    SLO (``slo_attainment``), only in ``slo_attainment_all``; a failed stream is a miss."""
    from bench.loadgen import Result  # noqa: PLC0415
    from bench.metrics import class_figures  # noqa: PLC0415
    from bench.workload import Planned  # noqa: PLC0415

    scenario = load(Path("bench/scenarios/contention.toml"))
    slo_s = scenario.classes["interactive"].ttft_slo_ms / 1000

    def result(i: int, tenant: str, *, stream: bool, ttft: float, error: str = "") -> Result:
        planned = Planned(index=i, at=0.0, tenant=tenant, klass="interactive",
                          prompt_tokens=10, max_tokens=10, stream=stream)  # fmt: skip
        return Result(planned=planned, sent=0.0, status=200, ttft=ttft, end=ttft, error=error)

    results = [
        result(0, "acme", stream=True, ttft=slo_s / 2),
        result(1, "acme", stream=False, ttft=slo_s * 3),  # a long unary answer: not a miss
        result(2, "floodco", stream=True, ttft=slo_s * 2),  # a late first token: a miss
        result(3, "floodco", stream=True, ttft=0.0, error="timeout"),  # failed: a miss
    ]
    figures = class_figures(scenario, results, duration=10.0)["interactive"]
    assert figures["slo_attainment"] == pytest.approx(1 / 3)
    assert figures["slo_attainment_all"] == pytest.approx(1 / 4)
    assert figures["by_tenant"]["acme"]["slo_attainment"] == 1.0
    assert figures["by_tenant"]["acme"]["streams"] == 1
    assert figures["by_tenant"]["floodco"]["slo_attainment"] == 0.0
    assert figures["unary_e2e_ms"]["p50"] == pytest.approx(slo_s * 3 * 1000, rel=1e-3)


def test_idle_cpu_reads_this_process_cpu_and_summarises_per_window() -> None:
    before = cpu_ns([os.getpid()])
    sum(i * i for i in range(200_000))  # some CPU
    assert cpu_ns([os.getpid()]) > before
    lines = summary({"main": [10.0, 8.0], "branch": [7.0, 6.0]})
    assert lines[1].startswith("branch: median 6.50 ms/s")
    assert lines[1].endswith("median 0.725")  # (0.70 + 0.75) / 2


def test_the_load_generator_freezes_its_start_up_objects_and_records_its_collections() -> None:
    import gc  # noqa: PLC0415

    from bench.loadgen import GcPauses  # noqa: PLC0415

    before = gc.get_freeze_count()
    with GcPauses() as pauses:
        assert gc.get_freeze_count() > before  # what existed is out of the phase's collections
        gc.collect()
    assert gc.get_freeze_count() == 0  # unfrozen again after the phase
    assert len(pauses.pauses_ms) == 1
    assert pauses.pauses_ms[0] >= 0.0
    gc.collect()
    assert len(pauses.pauses_ms) == 1  # the callback is gone
