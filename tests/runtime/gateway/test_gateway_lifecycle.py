"""Router start-up: not ready until a snapshot exists; restarts from its disk copy."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
import pytest
from fixtures.wait import eventually
from gateway_fleet import Publisher, World, http_get, start_router, wait_ready

pytestmark = pytest.mark.integration


def test_not_ready_before_a_snapshot_then_ready_and_restartable_from_disk(tmp_path: Path) -> None:
    publisher = Publisher(f"switchyard:test:gw-life:{uuid.uuid4().hex[:12]}")
    world = World()
    world.add_tenant("acme")
    key = world.add_key("good", "acme")
    world.add_model("some-model", 1)
    router = start_router(publisher.prefix, tmp_path)
    try:
        status, body = http_get(f"{router.base_url}/readyz")
        assert status == 503
        assert json.loads(body)["status"] == "not ready"
        assert http_get(f"{router.base_url}/healthz")[0] == 200
        refused = httpx.post(
            f"{router.base_url}/v1/chat/completions",
            json={"model": "some-model", "messages": [{"role": "user", "content": "x"}]},
            headers={"Authorization": f"Bearer {key}"},
            timeout=10,
        )
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "not_ready"
        models = httpx.get(
            f"{router.base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        assert models.status_code == 503

        version = publisher.publish(world.snapshot())
        wait_ready(router, version)
        # The disk copy is written just after the swap, off the event loop: wait for it.
        disk_copy = tmp_path / "router-snapshot.json"
        eventually(disk_copy.is_file, timeout=10, interval=0.05, what="the disk copy")
    finally:
        router.stop()

    publisher.cleanup()  # Redis forgets everything: the restart must use the disk copy
    router = start_router(publisher.prefix, tmp_path)
    try:
        status, body = http_get(f"{router.base_url}/readyz")
        assert status == 200
        ready = json.loads(body)
        assert ready.pop("snapshot_age_s") >= 0  # a disk copy is as old as its build
        assert ready == {
            "status": "ready",
            "snapshot_version": version,
            "snapshot_source": "disk",
            "snapshot_stale": False,
        }
        models = httpx.get(
            f"{router.base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        assert [m["id"] for m in models.json()["data"]] == ["some-model"]
    finally:
        router.stop()
        publisher.cleanup()  # the key-usage hash the router flushed on its way out
