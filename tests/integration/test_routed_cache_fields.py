"""The routed cache fields written through the operator REST API reach a real router and change
what it does (issue #28 item 3).

Real parts: PostgreSQL (the control plane's services and REST views, a transaction test so the
snapshot is published on commit), Redis, a router process (``python -m runtime.gateway``) and a
simulator engine. Each PATCH (``If-Match``) publishes a snapshot; the test waits until the
router serves it, then reads the router's answer header ``x-switchyard-cache`` (``hit``,
``miss``, or absent for a request the router does not cache) and the entries it wrote to Redis.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from django.contrib.auth import get_user_model
from fixtures.control_plane import model_served_by, tenants_with_keys
from fixtures.redis_keys import RouterNamespace
from fixtures.router import Process, start_router, wait_ready
from fixtures.wait import eventually
from rest_framework.test import APIClient

from apps.models.models import Model
from runtime import contract, snapshot_store
from tests.apps.rollouts.support import MODEL, start_simulator

pytestmark = [
    pytest.mark.integration,
    pytest.mark.timeout(90),
    pytest.mark.django_db(transaction=True),
]

OPS = "/api/v1/ops"
SHARED = "\\*"  # the shared scope "*", escaped for a Redis glob


@dataclass
class Stage:
    router: Process
    model: Model
    keys: dict[str, str]
    staff: APIClient
    client: redis.Redis[bytes]
    prefix: str

    @property
    def namespace(self) -> str:
        return contract.namespace_of(self.prefix)

    def patch(self, url: str, data: dict[str, Any]) -> None:
        """PATCH through REST with the current ETag, then wait until the router serves the
        snapshot that change published."""
        etag = self.staff.get(url)["ETag"]
        changed = self.staff.patch(url, data, format="json", HTTP_IF_MATCH=etag)
        assert changed.status_code == 200, changed.content
        version = snapshot_store.latest_version(self.client, prefix=self.prefix)
        assert version is not None
        wait_ready(self.router, version)

    def patch_model(self, **data: Any) -> None:
        self.patch(f"{OPS}/models/{self.model.pk}/", data)

    def ask(self, text: str, tenant: str = "acme") -> str | None:
        """A deterministic chat completion; the router's cache header (None: not cacheable)."""
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "temperature": 0,
            "max_tokens": 6,
        }
        response = httpx.post(
            f"{self.router.base_url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {self.keys[tenant]}"},
            timeout=10,
        )
        assert response.status_code == 200, response.text
        return response.headers.get("x-switchyard-cache")

    def entries(self, scope: str) -> list[bytes]:
        """The router's stored entries of ``scope`` (a glob: ``\\*`` is the shared scope)."""
        match = contract.cache_entry_key(self.namespace, scope, "*", "*")
        return list(self.client.scan_iter(match=match, count=1000))


def fresh() -> str:
    return f"tell me about {uuid.uuid4().hex[:10]}"


@pytest.fixture
def stage(router_namespace: RouterNamespace, tmp_path: Path) -> Iterator[Stage]:
    prefix, client = router_namespace.prefix, router_namespace.client
    started: list[Process] = []
    try:
        sim = start_simulator()
        started.append(sim)
        model = model_served_by(sim.base_url, tmp_path / "v1", name=MODEL)
        keys = tenants_with_keys(("acme", "beta"), max_concurrency=100)
        staff = APIClient()
        staff.force_login(get_user_model().objects.create_user(username="operator", is_staff=True))
        router = start_router(prefix, tmp_path / "router")
        started.append(router)
        stage = Stage(router, model, keys, staff, client, prefix)
        wait_ready(router, router_namespace.latest())
        yield stage
    finally:
        for process in started:
            process.stop()


def test_model_cache_fields_written_through_rest_drive_the_router(stage: Stage) -> None:
    cached = fresh()
    assert [stage.ask(cached), stage.ask(cached)] == ["miss", "hit"]  # the defaults: on

    stage.patch_model(cache_enabled=False)
    off = fresh()
    assert [stage.ask(off), stage.ask(off)] == [None, None]
    assert stage.ask(cached) is None  # the stored entry is not served either

    stage.patch_model(cache_enabled=True, cache_shared=True, cache_ttl_s=120)
    shared = fresh()
    assert stage.ask(shared, "acme") == "miss"
    assert stage.ask(shared, "beta") == "hit"  # one scope for every tenant
    eventually(lambda: stage.entries(SHARED), timeout=10, what="the shared entry in Redis")
    ttls = [stage.client.pttl(key) for key in stage.entries(SHARED)]
    assert all(60_000 < ttl <= 120_000 for ttl in ttls), ttls  # not the default 3600 s

    stage.patch_model(cache_shared=False)
    own = fresh()
    assert stage.ask(own, "acme") == "miss"
    assert stage.ask(own, "beta") == "miss"  # per tenant again
    assert stage.ask(own, "acme") == "hit"


def test_tenant_result_cache_written_through_rest_drives_the_router(stage: Stage) -> None:
    text = fresh()
    assert [stage.ask(text), stage.ask(text)] == ["miss", "hit"]

    stage.patch(f"{OPS}/tenants/acme/", {"result_cache": False})
    assert stage.ask(text) is None
    other = fresh()
    assert [stage.ask(other), stage.ask(other)] == [None, None]
    assert [stage.ask(other, "beta"), stage.ask(other, "beta")] == ["miss", "hit"]  # others on

    stage.patch(f"{OPS}/tenants/acme/", {"result_cache": True})
    assert stage.ask(text) == "hit"
