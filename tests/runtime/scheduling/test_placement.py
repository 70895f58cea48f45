"""FleetPlacement's per-snapshot layout: lookups cached per snapshot, live filters per call."""

from __future__ import annotations

import pytest

from runtime.routing.inflight import InFlight
from runtime.routing.signals import FleetSignals
from runtime.routing.table import RoutingTable
from runtime.scheduling.placement import FleetPlacement
from runtime.snapshot import Snapshot
from runtime.testing.snapshots import SnapshotBuilder
from runtime.upstream.breaker import BreakerBook, BreakerConfig
from runtime.upstream.client import UpstreamClient
from runtime.upstream.health import HealthMonitor

pytestmark = pytest.mark.unit


class World:
    """A placement for pool ``p`` over a snapshot the test replaces."""

    def __init__(self, snapshot: Snapshot) -> None:
        self.snapshot: Snapshot | None = snapshot
        self.breakers = BreakerBook(BreakerConfig(failure_threshold=1, cooldown_s=3600))
        health = HealthMonitor(UpstreamClient())
        inflight = InFlight()
        self.placement = FleetPlacement(
            "p", snapshot=lambda: self.snapshot, table=RoutingTable(), health=health,
            inflight=inflight, clock=lambda: 0.0,
            signals=FleetSignals(breakers=self.breakers, health=health, inflight=inflight),
        )  # fmt: skip

    def ids(self, version: int, exclude: frozenset[int] = frozenset()) -> list[int]:
        return [e.id for e in self.placement.candidates(version, exclude)]


def two_endpoints() -> SnapshotBuilder:
    return (
        SnapshotBuilder().add_model("m", 1).add_adapter("m-lora", 2, base_version=1)
        .add_endpoint(1, 1, pool="p", capacity=4).add_endpoint(2, 1, pool="p", capacity=6)
        .add_endpoint(3, 1, pool="q", capacity=100)
    )  # fmt: skip


def test_candidates_and_capacity_of_the_pool() -> None:
    world = World(two_endpoints().snapshot())
    assert world.ids(1) == [1, 2, 3]  # the version's endpoints, whatever their pool
    assert world.ids(2) == [1, 2, 3]  # an adapter: its base version's
    assert world.ids(1, frozenset({2})) == [1, 3]
    assert world.ids(7) == []
    assert world.placement.capacity() == 10  # pool p only


def test_live_filters_apply_on_every_call_of_one_snapshot() -> None:
    world = World(two_endpoints().snapshot())
    assert world.placement.capacity() == 10
    world.breakers.get(2).record_failure()  # its circuit opens
    assert world.ids(1) == [1, 3]
    assert world.placement.capacity() == 4
    endpoints = world.placement.candidates(1, frozenset())
    assert world.placement.choose(endpoints, None).id in {1, 3}


def test_a_new_snapshot_replaces_the_layout() -> None:
    world = World(two_endpoints().snapshot())
    assert world.placement.capacity() == 10
    world.snapshot = two_endpoints().add_endpoint(4, 1, pool="p", capacity=5).snapshot()
    assert world.ids(1) == [1, 2, 3, 4]
    assert world.placement.capacity() == 15
    world.snapshot = two_endpoints().add_endpoint(2, 1, pool="p", state="draining").snapshot()
    assert world.ids(1) == [1, 3]
    assert world.placement.capacity() == 4


def test_no_snapshot_no_candidates() -> None:
    world = World(two_endpoints().snapshot())
    world.snapshot = None
    assert world.ids(1) == []
    assert world.placement.capacity() == 0
