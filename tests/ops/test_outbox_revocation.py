"""A key revoked while Redis is down is enforced by a router once Redis is back (issue #10.4).

Real parts throughout: PostgreSQL, a redis-server of the test's own that is killed and brought
back, a router process (``python -m runtime.gateway``), and the control plane's services and
Celery task bodies. Beat is played by the test loop calling the beat tasks on their schedule
(``snapshot_outbox_drain`` every ``RETRY_S``, ``snapshot_refresh`` likewise), as the beat
process would send them.
"""

from __future__ import annotations

import contextlib
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
from fixtures.control_plane import interactive_class
from fixtures.private_redis import PrivateRedis
from fixtures.router import Process, http_get, metric_value, start_router, wait_ready
from fixtures.wait import eventually

from apps.common.models import SnapshotOutbox
from apps.core import tasks
from apps.tenants.models import Tenant
from apps.tenants.services import api_key_create, api_key_revoke, tenant_create
from runtime import snapshot_store
from runtime.redis_conn import sync_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

RETRY_S = 1.0  # the outbox drain's beat interval in this test
STALE_AFTER_S = 3.0
LOADER_RECONNECT_CAP_S = 1.0 * 1.2  # SnapshotLoader backoff cap, with its jitter


class Beat:
    """Sends the core beat tasks on their schedule, the way celery beat would."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._next = 0.0

    def tick(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.interval_s
        tasks.snapshot_outbox_drain.apply()
        with contextlib.suppress(Exception):  # Redis down: beat logs it and goes on
            tasks.snapshot_refresh.apply(throw=True)


def models_status(router: Process, key: str) -> int:
    request = urllib.request.Request(
        f"{router.base_url}/v1/models", headers={"Authorization": f"Bearer {key}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def scrape(router: Process, name: str) -> float | None:
    status, body = http_get(f"{router.base_url}/metrics")
    assert status == 200
    return metric_value(body.decode(), name)


@pytest.fixture
def world(settings: Any, server: PrivateRedis) -> tuple[Tenant, str]:
    settings.REDIS_URL = server.url
    settings.SNAPSHOT_REDIS_PREFIX = f"sytest:ops:{uuid.uuid4().hex}:snapshot"
    klass = interactive_class()
    tenant = tenant_create(
        actor=None,
        slug="acme",
        name="Acme",
        allowed_classes=[klass],
        default_class=klass,
        rpm_limit=600,
        tpm_limit=100_000,
        max_concurrency=4,
        max_context_tokens=4096,
        max_output_tokens=512,
    )
    return tenant, settings.SNAPSHOT_REDIS_PREFIX


@pytest.mark.django_db(transaction=True)
def test_revocation_during_redis_outage_is_enforced_once_redis_returns(
    world: tuple[Tenant, str], server: PrivateRedis, tmp_path: Path
) -> None:
    tenant, prefix = world
    api_key, full_key = api_key_create(actor=None, tenant=tenant, name="ci")
    assert not SnapshotOutbox.objects.exists()  # published on commit, entry gone
    with sync_client(server.url, name="test") as client:
        version = snapshot_store.latest_version(client, prefix=prefix)
    assert version is not None

    beat = Beat(RETRY_S)
    router = start_router(
        prefix,
        tmp_path / "router",
        REDIS_URL=server.url,
        SWITCHYARD_SNAPSHOT_STALE_AFTER_S=str(STALE_AFTER_S),
        SWITCHYARD_SNAPSHOT_CONFIRM_POLL_S="0.2",
    )
    try:
        wait_ready(router, version)
        assert models_status(router, full_key) == 200

        def fresh() -> bool:
            beat.tick()
            return scrape(router, "switchyard_snapshot_stale") == 0.0

        eventually(fresh, timeout=10.0, what="a confirmed snapshot is not stale")

        server.kill()
        api_key_revoke(actor=None, api_key=api_key)  # the publish after commit fails
        (entry,) = SnapshotOutbox.objects.all()
        assert entry.attempts == 1
        assert entry.last_error.startswith(("ConnectionError", "TimeoutError")), entry.last_error

        # The outage: the router keeps serving its last snapshot and says it is stale.
        def stale() -> bool:
            beat.tick()
            return scrape(router, "switchyard_snapshot_stale") == 1.0

        eventually(stale, timeout=STALE_AFTER_S + 5.0, what="the stale flag during the outage")
        age = scrape(router, "switchyard_snapshot_age_seconds")
        assert age is not None
        assert age > STALE_AFTER_S
        assert models_status(router, full_key) == 200  # not yet known: the outage window

        def retried() -> bool:
            beat.tick()
            return SnapshotOutbox.objects.get().attempts >= 2

        eventually(retried, timeout=RETRY_S * 5, what="beat retrying the publish, still failing")

        server.start()
        back = time.monotonic()

        def refused() -> bool:
            beat.tick()
            return models_status(router, full_key) == 401

        eventually(refused, timeout=30.0, what="the revoked key refused by the router")
        took = time.monotonic() - back
        assert took <= RETRY_S + LOADER_RECONNECT_CAP_S + 1.0, took
        assert not SnapshotOutbox.objects.exists()
        eventually(fresh, timeout=5.0, what="the snapshot fresh again")
        print(f"revocation enforced {took:.2f} s after Redis answered again")
    finally:
        router.stop()
