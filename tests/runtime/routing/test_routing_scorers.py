"""The scorers the dispatcher uses besides load: KV use, prefix affinity, cost tier."""

from __future__ import annotations

import string
from collections import Counter

import pytest
from routing_support import Signals, endpoint

from runtime.routing.endpoints import EndpointSelector, names, registry
from runtime.snapshot import EndpointSnap

pytestmark = pytest.mark.unit

ENDPOINTS = tuple(endpoint(i, pool=p) for i, p in ((1, "cheap"), (2, "dear"), (3, "cheap")))
RICH = [
    Signals(kv={1: 0.0, 2: 0.5, 3: 1.0}, costs={"cheap": 0.5, "dear": 12.0}, key="abc"),
    Signals(kv={1: 1.7, 2: -0.2}, costs={"cheap": 0.0}, key=""),
    Signals(kv={1: float("nan")}, costs={"dear": float("inf")}),
]


@pytest.mark.parametrize("name", names("scorers"))
@pytest.mark.parametrize("signals", RICH)
def test_every_scorer_stays_in_the_unit_interval(name: str, signals: Signals) -> None:
    scorer = registry("scorers")[name]()
    assert scorer.name == name
    for ep in ENDPOINTS:
        assert 0.0 <= scorer.score(ep, signals) <= 1.0


def test_kv_use_prefers_the_emptier_cache_and_is_neutral_when_unknown() -> None:
    scorer = registry("scorers")["kv_use"]()
    signals = Signals(kv={1: 0.1, 2: 0.8})
    assert scorer.score(ENDPOINTS[0], signals) == pytest.approx(0.9)
    assert scorer.score(ENDPOINTS[1], signals) == pytest.approx(0.2)
    assert scorer.score(ENDPOINTS[2], signals) == 0.5


def test_cost_tier_prefers_the_cheaper_pool() -> None:
    scorer = registry("scorers")["cost_tier"]()
    signals = Signals(costs={"cheap": 1.0, "dear": 3.0})
    assert scorer.score(ENDPOINTS[0], signals) == 0.5
    assert scorer.score(ENDPOINTS[1], signals) == 0.25
    assert scorer.score(ENDPOINTS[0], Signals()) == 0.5


def winner(
    selector: EndpointSelector, key: str, endpoints: tuple[EndpointSnap, ...] = ENDPOINTS
) -> int:
    chosen = selector.select(endpoints, Signals(key=key))
    assert chosen is not None
    return chosen.id


def test_prefix_affinity_is_consistent_spread_and_moves_only_the_lost_keys() -> None:
    keys = [f"prefix-{a}{b}" for a in string.ascii_lowercase for b in string.digits]
    first = EndpointSelector.from_policies({"scorers": "prefix_affinity"})
    second = EndpointSelector.from_policies({"scorers": "prefix_affinity"})  # another router
    placed = {k: winner(first, k) for k in keys}
    assert placed == {k: winner(second, k) for k in keys}
    assert set(Counter(placed.values())) == {1, 2, 3}  # every endpoint wins some keys
    assert min(Counter(placed.values()).values()) > len(keys) / 6
    without_two = tuple(e for e in ENDPOINTS if e.id != 2)
    for key, endpoint_id in placed.items():
        if endpoint_id != 2:
            assert winner(first, key, without_two) == endpoint_id  # nobody else moved
    assert registry("scorers")["prefix_affinity"]().score(ENDPOINTS[0], Signals()) == 0.5


def test_affinity_yields_to_load_by_weight() -> None:
    selector = EndpointSelector.from_policies({"scorers": "least_load:4,prefix_affinity:1"})
    key = "shared system prompt"
    favourite = winner(selector, key)
    busy = Signals(key=key, inflight={favourite: 4})  # the favourite is full (capacity 4)
    chosen = selector.select(ENDPOINTS, busy)
    assert chosen is not None
    assert chosen.id != favourite
