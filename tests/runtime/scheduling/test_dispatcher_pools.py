"""Pool settings from the snapshot, and the per-pool dispatchers across snapshot swaps."""

from __future__ import annotations

import asyncio
import logging

import msgspec
import pytest
from dispatch_support import HandFleet, settle, ticket, waiting
from fixtures.router import World

from runtime.scheduling.grant import NoEndpointError
from runtime.scheduling.pools import Dispatchers
from runtime.scheduling.settings import PoolSettings, SettingsError
from runtime.snapshot import RequestClassSnap, Snapshot

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]


def classes() -> list[RequestClassSnap]:
    def make(name: str, band: int, queue: int) -> RequestClassSnap:
        return RequestClassSnap(
            name=name, priority_band=band, ttft_slo_ms=500, deadline_ms=10_000,
            max_queue_length=queue, shed_order=band,
        )  # fmt: skip

    return [make("interactive", 0, 50), make("chat", 0, 80), make("batch", 2, 500)]


async def test_settings_come_from_the_policies_and_the_classes() -> None:
    settings = PoolSettings.from_policies({}, classes(), default_limit=1000)
    assert settings == PoolSettings(
        band_limits={0: 80, 2: 500}, default_limit=1000, max_total=500, band_shares={2: 0.05}
    )
    assert settings.headroom_for(isolating=True) == 0.25
    assert settings.headroom_for(isolating=False) == 0.0
    custom = PoolSettings.from_policies(
        {"fairness": "fcfs", "ordering": "fcfs", "saturation": "inflight_only",
         "headroom": "0.4", "max_queue": "64", "band_shares": "2:0.1"},
        classes(),
    )  # fmt: skip
    assert (custom.fairness, custom.ordering) == ("fcfs", "fcfs")
    assert custom.saturation == "inflight_only"
    assert custom.headroom_for(isolating=False) == 0.4
    assert custom.max_total == 64
    assert custom.band_shares == {2: 0.1}


@pytest.mark.parametrize(
    "policies",
    [
        {"max_queue": "lots"},
        {"max_queue": "0"},
        {"headroom": "1.5"},
        {"headroom": "x"},
        {"band_shares": "2"},
        {"band_shares": "a:0.1"},
        {"band_shares": "1:0.6,2:0.5"},
    ],
)
async def test_bad_policy_values_are_refused(policies: dict[str, str]) -> None:
    with pytest.raises(SettingsError):
        PoolSettings.from_policies(policies, classes())


def snapshot(world: World, **policies: str) -> Snapshot:
    world.pools["p"] = msgspec.structs.replace(world.pools["p"], policies=dict(policies))
    return world.snapshot()


async def test_dispatchers_follow_the_snapshot(caplog: pytest.LogCaptureFixture) -> None:
    world = World()
    world.add_model("m", 1)
    world.add_endpoint(1, 1, "http://h1", pool="p", capacity=1)
    fleet = HandFleet()
    fleet.add(1, capacity=1)
    dispatchers = Dispatchers(placement_for=lambda pool: fleet, tick_s=0.01)
    try:
        first = snapshot(world, fairness="fcfs")
        d = dispatchers.get(first, "p")
        assert dispatchers.get(first, "p") is d
        assert d.settings.fairness == "fcfs"
        busy = await d.acquire(ticket())
        queued = waiting(d, ticket("b"))
        await settle()
        with caplog.at_level(logging.ERROR, logger="runtime.scheduling.pools"):
            dispatchers.on_snapshot(snapshot(world, fairness="no-such-policy"))
        assert d.settings.fairness == "vtc"  # the default, and the mistake logged
        assert "pool p has invalid policies" in caplog.text
        assert "no-such-policy" in caplog.text
        assert len(d) == 1  # the queued request survived the swap
        world.pools.clear()
        world.endpoints.clear()
        dispatchers.on_snapshot(world.snapshot())  # the pool is gone
        with pytest.raises(NoEndpointError):
            await asyncio.wait_for(queued, 1)
        assert dispatchers.all() == []
        busy.release()
    finally:
        await dispatchers.stop()
