"""Snapshot staleness on a router: age since the last known-current moment, and its bound."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from django.conf import settings
from fixtures.redis_keys import RedisClient
from fixtures.wait import async_eventually

from runtime import snapshot_store
from runtime.snapshot import Snapshot
from runtime.snapshot_loader import SnapshotLoader
from runtime.telemetry.metrics import RouterMetrics

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest_asyncio.fixture
async def loader(key_prefix: str, tmp_path: Path) -> AsyncIterator[tuple[SnapshotLoader, Clock]]:
    clock = Clock()
    loader = SnapshotLoader(
        settings.REDIS_URL,
        tmp_path / "snapshot.json",
        key_prefix,
        stale_after_s=60.0,
        confirm_poll_s=0.05,
        clock=clock,
    )
    yield loader, clock
    await loader.stop()


def metric(metrics: RouterMetrics, name: str) -> float | None:
    return metrics.registry.get_sample_value(name)


@pytest.mark.asyncio
async def test_age_counts_from_build_and_confirmation_resets_it(
    redis_client: RedisClient, key_prefix: str, loader: tuple[SnapshotLoader, Clock]
) -> None:
    router, clock = loader
    metrics = RouterMetrics()
    metrics.attach_snapshot(router)
    assert metric(metrics, "switchyard_snapshot_stale") == 1.0  # nothing loaded yet
    assert metric(metrics, "switchyard_snapshot_age_seconds") == -1.0

    built = clock.now - 10.0
    version = snapshot_store.publish(
        redis_client, Snapshot(version=0, created_at=built), prefix=key_prefix
    ).version
    await router.start()
    assert router.age_s() == pytest.approx(10.0)
    assert not router.stale
    assert metric(metrics, "switchyard_snapshot_stale") == 0.0
    assert metric(metrics, "switchyard_snapshot_version") == version

    clock.now += 55.0  # 65 s since the build, nobody confirmed it since
    assert router.stale
    assert metric(metrics, "switchyard_snapshot_stale") == 1.0
    assert metric(metrics, "switchyard_snapshot_age_seconds") == pytest.approx(65.0)
    assert metric(metrics, "switchyard_snapshot_stale_after_seconds") == 60.0

    snapshot_store.confirm(redis_client, version=version, at=clock.now - 1.0, prefix=key_prefix)
    await async_eventually(lambda: not router.stale, timeout=5.0, what="confirmed fresh")
    assert router.age_s() == pytest.approx(1.0, abs=0.01)

    # A newer snapshot resets the age to its own build time, whatever was confirmed before.
    snapshot_store.publish(
        redis_client, Snapshot(version=0, created_at=clock.now - 5.0), prefix=key_prefix
    )
    await router.wait_for_version(version + 1, timeout_s=5.0)
    assert router.age_s() == pytest.approx(5.0, abs=0.01)
    assert metric(metrics, "switchyard_snapshot_stale") == 0.0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"12:1700000000.5", snapshot_store.Confirmation(version=12, at=1700000000.5)),
        (None, None),
        (b"junk", None),
        (b"0:1700000000", None),
        (b"3:-1", None),
        (b"3:", None),
    ],
)
def test_confirmation_parsing(raw: bytes | None, expected: object) -> None:
    assert snapshot_store.parse_confirmation(raw) == expected


def test_stale_bound_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="stale_after_s"):
        SnapshotLoader("redis://127.0.0.1:1/0", tmp_path / "s.json", stale_after_s=0)
