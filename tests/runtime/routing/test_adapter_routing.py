"""LoRA adapter routing: placement rule, single flight, base endpoints, upstream name, flags."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from runtime.routing.adapters import (
    AllPinned,
    Choice,
    LoadFailedError,
    ReplicaView,
    SingleFlight,
    adapter_choice,
)
from runtime.routing.table import RoutingTable
from runtime.testing.snapshots import SnapshotBuilder
from runtime.workers.launch import LORA_RUNTIME_ENV, WorkerSpec, build_command, build_env

pytestmark = pytest.mark.unit


def view(endpoint: int, *, resident: bool = False, in_flight: int = 0, **kw: float) -> ReplicaView:
    return ReplicaView(endpoint=endpoint, resident=resident, in_flight=in_flight, capacity=4, **kw)  # type: ignore[arg-type]


def test_resident_wins_until_saturated() -> None:
    replicas = [view(1, resident=True, in_flight=3), view(2)]
    assert adapter_choice(replicas, service_s=1.0) == Choice(1, needs_load=False)
    replicas = [view(1, resident=True, in_flight=4), view(2, in_flight=1)]
    assert adapter_choice(replicas, service_s=1.0) == Choice(2, needs_load=True)


def test_cold_goes_to_least_load_plus_load_time() -> None:
    replicas = [view(1, in_flight=0, load_s=2.0), view(2, in_flight=2, load_s=0.1)]
    # 0 + 2.0 against 0.5 * 1.0 + 0.1
    assert adapter_choice(replicas, service_s=1.0) == Choice(2, needs_load=True)
    assert adapter_choice(replicas, service_s=10.0) == Choice(1, needs_load=True)


def test_pinned_replicas_are_skipped_and_all_pinned_is_refused() -> None:
    replicas = [view(1, pinned_for_s=3.0), view(2, in_flight=3)]
    assert adapter_choice(replicas, service_s=1.0) == Choice(2, needs_load=True)
    replicas = [view(1, pinned_for_s=3.0), view(2, pinned_for_s=1.5)]
    assert adapter_choice(replicas, service_s=1.0) == AllPinned(retry_after_s=1.5)
    busy = [view(1, resident=True, in_flight=9), view(2, pinned_for_s=1.0)]
    assert adapter_choice(busy, service_s=1.0) == Choice(1, needs_load=False)
    assert adapter_choice([], service_s=1.0) is None


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
