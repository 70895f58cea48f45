"""Endpoint choice: filters, scorers, pickers (one conformance suite per interface)."""

from __future__ import annotations

import logging
from collections import Counter

import pytest
from routing_support import Signals, endpoint, pool, snapshot

from runtime.policy_names import UnknownPolicyError
from runtime.routing.endpoints import EndpointSelector, names, registry
from runtime.routing.inflight import InFlight
from runtime.routing.table import RoutingTable

pytestmark = pytest.mark.unit

ENDPOINTS = (
    endpoint(1),
    endpoint(2, state="starting"),
    endpoint(3, state="draining"),
    endpoint(4, capacity=1),
    endpoint(5, capacity=100),
)
SIGNAL_CASES = [
    Signals(),
    Signals(open_breakers={1, 4}),
    Signals(unhealthy={5}),
    Signals(inflight={1: 3, 4: 9, 5: 250}),
    Signals(cached={1: 1.0, 4: 0.25, 5: float("nan")}),
]


@pytest.mark.parametrize("name", names("filters"))
@pytest.mark.parametrize("signals", SIGNAL_CASES)
def test_filter_conformance(name: str, signals: Signals) -> None:
    flt = registry("filters")[name]()
    assert flt.name == name
    for ep in ENDPOINTS:
        assert isinstance(flt.keep(ep, signals), bool)


@pytest.mark.parametrize("name", names("scorers"))
@pytest.mark.parametrize("signals", SIGNAL_CASES)
def test_scorer_conformance(name: str, signals: Signals) -> None:
    scorer = registry("scorers")[name]()
    assert scorer.name == name
    for ep in ENDPOINTS:
        assert 0.0 <= scorer.score(ep, signals) <= 1.0


@pytest.mark.parametrize("name", names("picker"))
def test_picker_conformance(name: str) -> None:
    picker = registry("picker")[name]()
    assert picker.name == name
    scored = [(ep, 1.0 / ep.id) for ep in ENDPOINTS]
    for _ in range(5):
        assert picker.pick(scored) in ENDPOINTS
    assert picker.pick(scored[:1]) is ENDPOINTS[0]


def test_default_filters_keep_only_ready_closed_healthy_endpoints() -> None:
    selector = EndpointSelector.from_policies({})
    signals = Signals(open_breakers={4}, unhealthy={5})
    assert [e.id for e in selector.eligible(ENDPOINTS, signals)] == [1]
    assert [e.id for e in selector.eligible(ENDPOINTS, Signals(), exclude={1})] == [4, 5]


def test_least_load_picks_the_lowest_inflight_over_capacity() -> None:
    selector = EndpointSelector.from_policies({})
    eps = (endpoint(1, capacity=4), endpoint(2, capacity=8))
    # 2/4 = 0.5 busy vs 2/8 = 0.25 busy: the bigger endpoint wins.
    assert selector.select(eps, Signals(inflight={1: 2, 2: 2})).id == 2
    assert selector.select(eps, Signals(inflight={1: 0, 2: 1})).id == 1
    assert selector.select(eps, Signals(open_breakers={1, 2})) is None


def test_ties_are_shared_round_robin() -> None:
    selector = EndpointSelector.from_policies({})
    eps = (endpoint(1), endpoint(2), endpoint(3))
    picks = Counter(selector.select(eps, Signals()).id for _ in range(30))  # type: ignore[union-attr]
    assert picks == {1: 10, 2: 10, 3: 10}


def test_policies_choose_by_name_and_weights() -> None:
    selector = EndpointSelector.from_policies(
        {"filters": "ready", "scorers": "least_load:2", "picker": "max_score"}
    )
    assert [f.name for f in selector.filters] == ["ready"]
    assert [(s.name, w) for s, w in selector.scorers] == [("least_load", 2.0)]


@pytest.mark.parametrize(
    "policies",
    [
        {"filters": "ready,teleport"},
        {"scorers": "vibes"},
        {"scorers": "least_load:lots"},
        {"scorers": "least_load:0"},
        {"scorers": "least_load:nan"},
        {"picker": "coin_flip"},
    ],
)
def test_unknown_or_bad_policies_are_refused(policies: dict[str, str]) -> None:
    with pytest.raises(UnknownPolicyError):
        EndpointSelector.from_policies(policies)


def test_routing_table_indexes_endpoints_by_version_and_falls_back_on_bad_policies(
    caplog: pytest.LogCaptureFixture,
) -> None:
    snap = snapshot(
        versions=(1, 2),
        endpoints=(endpoint(1, 1), endpoint(2, 2), endpoint(3, 1, state="starting")),
        pools=(pool("p", scorers="nonsense"),),
    )
    table = RoutingTable()
    assert [e.id for e in table.endpoints(snap, 1)] == [1, 3]
    assert table.endpoints(snap, 99) == ()
    assert table.pick(snap, 99, Signals()) is None
    with caplog.at_level(logging.ERROR, logger="runtime.routing.table"):
        picked = table.pick(snap, 1, Signals())
    assert picked is not None
    assert picked.id == 1
    assert "pool p has invalid policies" in caplog.text
    assert "unknown scorer 'nonsense'" in caplog.text
    assert table.pick(snap, 1, Signals(), exclude=frozenset({1})) is None
    assert table.policies(snap, 2) == {"scorers": "nonsense"}


def test_inflight_counts() -> None:
    inflight = InFlight()
    with inflight.track(1):
        inflight.acquire(1)
        inflight.acquire(2)
        assert inflight.get(1) == 2
        assert inflight.total() == 3
        inflight.release(1)
    assert inflight.snapshot() == {2: 1}
    inflight.release(2)
    inflight.release(2)  # never negative
    assert inflight.get(2) == 0
    inflight.acquire(7)
    inflight.retain([1])
    assert inflight.snapshot() == {}


def test_routing_and_scheduling_share_one_unknown_policy_error() -> None:
    from runtime.scheduling import registry as scheduling  # noqa: PLC0415

    assert UnknownPolicyError is scheduling.UnknownPolicyError
    with pytest.raises(UnknownPolicyError, match="known: filters, picker, scorers"):
        registry("sorters")  # type: ignore[arg-type]


@pytest.mark.parametrize("interface", ["filters", "scorers", "picker"])
def test_each_registered_class_is_found_by_its_own_name(interface: str) -> None:
    table = registry(interface)  # type: ignore[arg-type]
    assert table
    assert all(cls.name == name for name, cls in table.items())
