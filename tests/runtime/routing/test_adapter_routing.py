"""LoRA adapter routing: the adapter_residency scorer's tiers in the pool's default selector,
single flight, base endpoints, upstream name, flags."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from routing_support import Signals, endpoint

from runtime.routing.adapters import (
    AdapterResidencyScorer,
    AdapterSignal,
    LoadFailedError,
    SingleFlight,
)
from runtime.routing.endpoints import EndpointSelector, names
from runtime.routing.table import RoutingTable
from runtime.testing.snapshots import SnapshotBuilder
from runtime.workers.launch import LORA_RUNTIME_ENV, WorkerSpec, build_command, build_env

pytestmark = pytest.mark.unit

EPS = (endpoint(1, capacity=4), endpoint(2, capacity=4))


def pick(adapters: dict[int, AdapterSignal], inflight: dict[int, int] | None = None) -> int:
    """The endpoint the default selector picks (least_load,adapter_residency:10)."""
    selector = EndpointSelector.from_policies({})
    chosen = selector.select(EPS, Signals(inflight=inflight or {}, adapters=adapters))
    assert chosen is not None
    return chosen.id


def test_the_scorer_is_registered_and_on_by_default() -> None:
    assert "adapter_residency" in names("scorers")
    scorers = EndpointSelector.from_policies({}).scorers
    assert [(s.name, w) for s, w in scorers] == [("least_load", 1.0), ("adapter_residency", 10.0)]


def test_resident_wins_over_a_lighter_replica_until_saturated() -> None:
    resident, cold = AdapterSignal(resident=True), AdapterSignal(resident=False)
    assert pick({1: resident, 2: cold}, {1: 3, 2: 0}) == 1  # sticky though busier
    assert pick({1: resident, 2: cold}, {1: 4, 2: 1}) == 2  # saturated: loads on 2


def test_active_beats_resident_and_a_full_batch_is_avoided() -> None:
    active = AdapterSignal(resident=True, active=2)
    assert pick({1: AdapterSignal(resident=True), 2: active}, {1: 0, 2: 3}) == 2
    full = AdapterSignal(resident=True, batch_full=True)
    assert pick({1: full, 2: AdapterSignal(resident=False)}, {1: 0, 2: 2}) == 2  # loads on 2
    assert pick({1: full, 2: AdapterSignal(resident=False, batch_full=True)}) == 1


def test_cold_goes_to_least_load_plus_load_time_and_pinned_is_last() -> None:
    slow, fast = (
        AdapterSignal(resident=False, load_s=2.0),
        AdapterSignal(resident=False, load_s=0.1),
    )
    assert pick({1: slow, 2: fast}, {1: 0, 2: 1}) == 2
    assert pick({1: fast, 2: fast}, {1: 2, 2: 1}) == 2
    pinned = AdapterSignal(resident=False, pinned=True)
    assert pick({1: pinned, 2: fast}, {1: 0, 2: 3}) == 2


def test_requests_without_an_adapter_rank_by_load_alone() -> None:
    scorer = AdapterResidencyScorer()
    assert scorer.score(EPS[0], Signals()) == 0.5
    assert pick({}, {1: 2, 2: 1}) == 2
    assert pick({}, {1: 0, 2: 1}) == 1


@pytest.mark.asyncio
async def test_single_flight_shares_one_load() -> None:
    flights = SingleFlight()
    calls = 0
    release = asyncio.Event()

    async def load() -> None:
        nonlocal calls
        calls += 1
        await release.wait()

    tasks = [asyncio.create_task(flights.run(("ep1", "lora"), load)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()
    ran = await asyncio.gather(*tasks)
    assert calls == 1
    assert sorted(ran) == [False, False, False, False, True]
    assert await flights.run(("ep1", "lora"), load) is True  # the next one is a new flight


@pytest.mark.asyncio
async def test_failed_load_is_shared_and_cooled_down() -> None:
    now = [100.0]
    flights = SingleFlight(cooldown_s=10, clock=lambda: now[0])
    calls = 0

    async def broken() -> None:
        nonlocal calls
        calls += 1
        await asyncio.sleep(0)
        raise RuntimeError("No adapter found")

    results = await asyncio.gather(
        *(flights.run("k", broken) for _ in range(3)), return_exceptions=True
    )
    assert calls == 1
    assert all(isinstance(r, LoadFailedError) and r.reason == "No adapter found" for r in results)
    now[0] = 104.0
    with pytest.raises(LoadFailedError) as info:
        await flights.run("k", broken)
    assert calls == 1
    assert info.value.retry_after_s == pytest.approx(6.0)
    now[0] = 111.0
    with pytest.raises(LoadFailedError):
        await flights.run("k", broken)
    assert calls == 2


def test_adapters_are_served_by_their_base_endpoints() -> None:
    snapshot = (
        SnapshotBuilder()
        .add_model("base", 1)
        .add_adapter("base-support", 2, base_version=1)
        .add_endpoint(10, 1)
        .add_endpoint(11, 1)
        .snapshot()
    )
    table = RoutingTable()
    assert [e.id for e in table.endpoints(snapshot, 2)] == [10, 11]
    assert table.pool_of(snapshot, 2) == table.pool_of(snapshot, 1) == "cpu"


def test_launcher_enables_runtime_lora_when_asked() -> None:
    spec = WorkerSpec(artifact_dir=Path("/m"), expected_digest="0" * 64, served_model_name="m",
                      port=8000, max_loras=2, max_lora_rank=8)  # fmt: skip
    argv = build_command(spec)
    i = argv.index("--enable-lora")
    assert argv[i : i + 5] == ["--enable-lora", "--max-loras", "2", "--max-lora-rank", "8"]
    assert build_env(spec, {})[LORA_RUNTIME_ENV] == "True"
    plain = WorkerSpec(
        artifact_dir=Path("/m"), expected_digest="0" * 64, served_model_name="m", port=8000
    )
    assert "--enable-lora" not in build_command(plain)
    sim = WorkerSpec(artifact_dir=Path("/m"), expected_digest="0" * 64, served_model_name="m",
                     port=8000, backend="simulator", max_loras=2)  # fmt: skip
    assert build_command(sim)[-2:] == ["--max-loras", "2"]
    assert LORA_RUNTIME_ENV not in build_env(plain, {})
