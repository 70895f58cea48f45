"""Version choice: route splits, stickiness stable across processes, newest by default."""

from __future__ import annotations

import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from routing_support import snapshot

from runtime.routing.versions import NoVersionError, choose_version, sticky_point
from runtime.snapshot import ModelSnap

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[3]


def test_without_a_route_the_newest_published_version_serves() -> None:
    snap = snapshot(versions=(3, 7, 5))  # published order: 5 is the newest
    assert choose_version(snap, snap.models["m"], tenant="t").id == 5


def test_a_model_without_usable_versions_raises() -> None:
    snap = snapshot(versions=(1,))
    ghost = ModelSnap(name="m", task="chat", versions=(99,))
    with pytest.raises(NoVersionError):
        choose_version(snap, ghost, tenant="t")


def test_splits_are_sticky_per_tenant_and_follow_the_weights() -> None:
    snap = snapshot(versions=(1, 2), splits=((1, 80), (2, 20)))
    model = snap.models["m"]
    chosen = {
        f"tenant-{i}": choose_version(snap, model, tenant=f"tenant-{i}").id for i in range(2000)
    }
    for tenant, version_id in list(chosen.items())[:50]:
        assert all(choose_version(snap, model, tenant=tenant).id == version_id for _ in range(3))
    share = Counter(chosen.values())[2] / len(chosen)
    assert 0.16 < share < 0.24


def test_growing_the_last_split_only_moves_keys_onto_it() -> None:
    before = snapshot(versions=(1, 2), splits=((1, 95), (2, 5)))
    after = snapshot(versions=(1, 2), splits=((1, 75), (2, 25)))
    for i in range(500):
        tenant = f"t{i}"
        old = choose_version(before, before.models["m"], tenant=tenant).id
        new = choose_version(after, after.models["m"], tenant=tenant).id
        assert not (old == 2 and new == 1)


def test_sticky_by_user_when_the_route_says_so() -> None:
    snap = snapshot(versions=(1, 2), splits=((1, 50), (2, 50)), sticky_key="user")
    model = snap.models["m"]
    by_user = {choose_version(snap, model, tenant="same", user=f"u{i}").id for i in range(64)}
    assert by_user == {1, 2}
    # No user given: sticky on the tenant.
    assert len({choose_version(snap, model, tenant="same").id for _ in range(20)}) == 1


def test_non_sticky_routes_draw_from_the_rng() -> None:
    snap = snapshot(versions=(1, 2), splits=((1, 50), (2, 50)), sticky_key="none")
    rng = random.Random(7)
    drawn = Counter(
        choose_version(snap, snap.models["m"], tenant="t", rng=rng).id for _ in range(400)
    )
    assert drawn[1] > 120
    assert drawn[2] > 120


def test_splits_naming_unknown_or_zero_weight_versions_are_skipped() -> None:
    snap = snapshot(versions=(1, 2), splits=((9, 100), (1, 0), (2, 1)))
    assert {choose_version(snap, snap.models["m"], tenant=f"t{i}").id for i in range(50)} == {2}
    empty = snapshot(versions=(1, 2), splits=((9, 100),))
    assert choose_version(empty, empty.models["m"], tenant="t").id == 2


def test_sticky_point_is_the_same_in_another_process() -> None:
    here = [sticky_point("m", f"tenant-{i}", 100) for i in range(20)]
    code = (
        "from runtime.routing.versions import sticky_point;"
        "print([sticky_point('m', f'tenant-{i}', 100) for i in range(20)])"
    )
    there = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
        env={"PYTHONHASHSEED": "12345", "PATH": ""}, cwd=REPO_ROOT,
    ).stdout  # fmt: skip
    assert there.strip() == str(here)


def test_excluded_tenants_always_get_the_stable_version() -> None:

    base = snapshot(versions=(1, 2), splits=((1, 1), (2, 99)))
    route = msgspec.structs.replace(
        base.routes["m"], stable_version=1, exclude_tenants=("vip", "bank")
    )
    snap = msgspec.structs.replace(base, routes={"m": route})
    model = snap.models["m"]
    assert {choose_version(snap, model, tenant=t).id for t in ("vip", "bank")} == {1}
    others = Counter(choose_version(snap, model, tenant=f"t{i}").id for i in range(200))
    assert others[2] > 180  # everyone else follows the 99 % split


def test_an_exclusion_with_an_unknown_stable_version_follows_the_split() -> None:

    base = snapshot(versions=(1, 2), splits=((2, 100),))
    route = msgspec.structs.replace(base.routes["m"], stable_version=42, exclude_tenants=("vip",))
    snap = msgspec.structs.replace(base, routes={"m": route})
    assert choose_version(snap, snap.models["m"], tenant="vip").id == 2
