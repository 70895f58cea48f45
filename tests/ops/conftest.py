"""Fixtures the ops tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.private_redis import PrivateRedis, running


@pytest.fixture
def server(tmp_path: Path) -> Iterator[PrivateRedis]:
    """A redis-server of the test's own (to kill and restart), stopped after the test."""
    with running(tmp_path / "redis") as server:
        yield server
