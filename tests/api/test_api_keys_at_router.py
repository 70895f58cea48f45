"""End to end through the real halves: a key created through the REST API authenticates at a
router process within a second, and a revoked one stops within a second.

The control plane publishes the snapshot to Redis (REDIS_URL, under a test prefix) when the
API's service commits; the router (`python -m runtime.gateway`) picks it up from pub/sub.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fixtures.router import Process, Publisher, start_router, wait_ready
from fixtures.wait import eventually

from apps.core.services import snapshot_publish
from tests.api.conftest import World, session_client

pytestmark = [pytest.mark.integration, pytest.mark.timing]

PROPAGATION_S = 1.0


@pytest.fixture
def snapshot_prefix(settings: Any) -> Iterator[str]:
    """The publisher and the router share a fresh prefix in this helper's Redis database."""
    prefix = f"switchyard:test:rest-api:{uuid.uuid4().hex[:12]}"
    settings.SNAPSHOT_REDIS_PREFIX = prefix
    publisher = Publisher(prefix)
    yield prefix
    publisher.cleanup()


@pytest.fixture
def router(
    snapshot_prefix: str, transactional_db: Any, world: World, tmp_path: Path
) -> Iterator[Process]:
    version = snapshot_publish()
    process = start_router(snapshot_prefix, tmp_path)
    try:
        wait_ready(process, version)
        yield process
    finally:
        process.stop()


def _status(router: Process, key: str) -> int:
    response = httpx.get(
        f"{router.base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=2
    )
    return response.status_code


def test_created_key_works_within_a_second_and_revoked_key_stops(
    router: Process, world: World
) -> None:
    client = session_client(world.a.users["admin"])
    created = client.post("/api/v1/tenants/acme/api-keys/", {"name": "router test"}, format="json")
    assert created.status_code == 201, created.content
    key, prefix = created.json()["key"], created.json()["prefix"]
    start = time.monotonic()
    eventually(
        lambda: _status(router, key) == 200,
        timeout=PROPAGATION_S,
        interval=0.02,
        what="the new key authenticating at the router",
    )
    accepted_after = time.monotonic() - start

    revoked = client.post(f"/api/v1/tenants/acme/api-keys/{prefix}/revoke/")
    assert revoked.status_code == 200
    start = time.monotonic()
    eventually(
        lambda: _status(router, key) == 401,
        timeout=PROPAGATION_S,
        interval=0.02,
        what="the revoked key being refused at the router",
    )
    refused_after = time.monotonic() - start
    print(f"key accepted after {accepted_after:.3f} s, refused after {refused_after:.3f} s")
    # The other tenant's key was never affected.
    assert _status(router, world.b.key_secret) == 200
