"""Heterogeneous pools: a model served on a cheap CPU tier and a dear GPU tier. With the
``cost_tier`` scorer next to ``least_load`` (as a pool's policies name them), routing prefers
the cheaper tier while it is healthy and has room, and moves to the dearer one when the cheap
one is unhealthy or full (its SLO would not hold). The costs come from the snapshot's pools
through the real RequestSignals.
"""

from __future__ import annotations

import pytest

from runtime.routing.endpoints import EndpointSelector
from runtime.routing.signals import RequestSignals
from runtime.snapshot import EndpointSnap, PoolSnap, Snapshot

pytestmark = pytest.mark.unit


def pool(name: str, tier: str, cost: float) -> PoolSnap:
    return PoolSnap(
        name=name, hardware_tier=tier, cost_per_replica_hour=cost, min_replicas=0,
        max_replicas=2, warm_replicas=0, policies={"scorers": "cost_tier:1,least_load:1"},
    )  # fmt: skip


CPU = EndpointSnap(id=1, pool="encoder-cpu", version=7, base_url="http://cpu", state="ready",
                   capacity=8)  # fmt: skip
GPU = EndpointSnap(id=2, pool="encoder-gpu", version=7, base_url="http://gpu", state="ready",
                   capacity=8)  # fmt: skip
SNAPSHOT = Snapshot(
    version=1,
    created_at=0.0,
    pools={
        "encoder-cpu": pool("encoder-cpu", "cpu", 0.2),
        "encoder-gpu": pool("encoder-gpu", "h100", 4.0),
    },
    endpoints={1: CPU, 2: GPU},
)


class Fleet:
    def __init__(
        self, *, unhealthy: set[int] | None = None, inflight: dict[int, int] | None = None
    ):
        self.unhealthy = unhealthy or set()
        self.counts = inflight or {}

    def breaker_available(self, endpoint_id: int) -> bool:
        return True

    def healthy(self, endpoint_id: int) -> bool:
        return endpoint_id not in self.unhealthy

    def inflight(self, endpoint_id: int) -> int:
        return self.counts.get(endpoint_id, 0)

    def kv_usage(self, endpoint_id: int) -> float | None:
        return None

    def cost_per_hour(self, endpoint: EndpointSnap) -> float | None:
        return None

    def affinity_key(self) -> str | None:
        return None


def choose(fleet: Fleet) -> EndpointSnap | None:
    selector = EndpointSelector.from_policies(SNAPSHOT.pools["encoder-cpu"].policies)
    return selector.select([CPU, GPU], RequestSignals(fleet, SNAPSHOT))


def test_the_cheaper_tier_wins_while_healthy_and_idle():
    for _ in range(5):  # not a round-robin tie
        assert choose(Fleet()) == CPU


def test_the_cheaper_tier_keeps_winning_under_moderate_load():
    assert choose(Fleet(inflight={1: 4})) == CPU


def test_the_dearer_tier_takes_over_when_the_cheap_one_is_unhealthy():
    assert choose(Fleet(unhealthy={1})) == GPU


def test_the_dearer_tier_takes_over_when_the_cheap_one_is_full():
    assert choose(Fleet(inflight={1: 8})) == GPU
