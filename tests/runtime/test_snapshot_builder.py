"""runtime.testing.snapshots: the one hand-built snapshot builder of the tests and bench."""

from __future__ import annotations

import pytest

from runtime.gateway.auth import authenticate
from runtime.snapshot import decode, encode
from runtime.testing.snapshots import SnapshotBuilder

pytestmark = pytest.mark.unit


def test_a_small_world_is_a_valid_snapshot_whose_keys_authenticate() -> None:
    world = (
        SnapshotBuilder()
        .add_class("interactive", band=0)
        .add_tenant("acme", classes=("interactive",), default_class="interactive")
    )
    key = world.add_key("k", "acme")
    world.add_model("tiny", 1).add_endpoint(1, 1, "http://127.0.0.1:9")
    snap = decode(encode(world.snapshot(version=3)))
    assert snap.version == 3
    assert world.secrets["k"] == key
    assert authenticate(snap, key, now=0.0).tenant.default_class == "interactive"
    assert snap.pools["cpu"].policies == {}  # the endpoint's pool, made on first use
    assert snap.endpoints[1].state == "ready"
    assert snap.versions[1].model == "tiny"


def test_versions_routes_and_prices() -> None:
    world = SnapshotBuilder().add_model("m", 1).add_version("m", 2).add_version("m", 1)
    world.add_route("m", ((1, 80), (2, 20)), sticky_key="user")
    world.add_price(2, input_per_1k=0.1, output_per_1k=0.3)
    snap = world.snapshot()
    assert snap.models["m"].versions == (2, 1)  # republishing 1 makes it the newest
    assert [(s.version, s.weight) for s in snap.routes["m"].splits] == [(1, 80), (2, 20)]
    assert snap.routes["m"].sticky_key == "user"
    assert snap.prices[0].hardware_tier == "cpu"


def test_any_struct_field_passes_through_and_unknown_ones_are_refused() -> None:
    world = SnapshotBuilder().add_tenant("t", status="suspended", weight=3.0)
    assert (world.tenants["t"].status, world.tenants["t"].weight) == ("suspended", 3.0)
    with pytest.raises(TypeError):
        world.add_tenant("u", no_such_field=1)


def test_a_given_key_must_be_in_the_production_format() -> None:
    with pytest.raises(ValueError, match="API-key format"):
        SnapshotBuilder().add_key("k", "t", full_key="sk-not-ours")
