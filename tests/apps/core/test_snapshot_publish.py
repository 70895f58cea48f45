"""Publishing the snapshot from the control plane, end to end with a running SnapshotLoader.

A change made through a service (or the admin, which calls the service) commits, the snapshot
is republished after commit, and a router's loader swaps to it within a second.
"""

from __future__ import annotations

import asyncio
import io
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
from django.conf import settings
from django.core.management import CommandError, call_command
from django.db import connection, transaction
from django.test import Client
from fixtures.control_plane import TIGHT_LIMITS as LIMITS
from fixtures.control_plane import interactive_class

from apps.common.models import SnapshotOutbox
from apps.core import services
from apps.core.publisher import publish_current, publish_if_changed
from apps.core.tasks import snapshot_refresh
from apps.tenants.models import RequestClass, Tenant
from apps.tenants.services import request_class_create, tenant_create, tenant_update
from runtime import snapshot_store
from runtime.snapshot import Snapshot
from runtime.snapshot_loader import SnapshotLoader

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

T = TypeVar("T")


@pytest.fixture
def prefix(settings: Any, key_prefix: str) -> str:
    """A snapshot prefix of this test's own, so tests never see each other's snapshots."""
    settings.SNAPSHOT_REDIS_PREFIX = key_prefix
    return key_prefix


def latest(client: redis.Redis[bytes], prefix: str) -> Snapshot:
    snapshot = snapshot_store.read_latest(client, prefix=prefix)
    assert snapshot is not None
    return snapshot


class LoaderThread:
    """A SnapshotLoader on its own event loop in a thread, as a router would run it."""

    def __init__(self, prefix: str, cache_path: Path) -> None:
        self.loader = SnapshotLoader(settings.REDIS_URL, cache_path, prefix)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 5.0) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout_s)

    def close(self) -> None:
        try:
            self.run(self.loader.stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=5)
            self.loop.close()


@pytest.fixture
def router(prefix: str, tmp_path: Path) -> Iterator[LoaderThread]:
    """A started loader. Publishes the current state first so there is something to load."""
    publish_current()
    thread = LoaderThread(prefix, tmp_path / "snapshot.json")
    try:
        thread.run(thread.loader.start())
        yield thread
    finally:
        thread.close()


def wait_for_latest(
    router: LoaderThread, client: redis.Redis[bytes], prefix: str, *, started: float
) -> Snapshot:
    """Wait until the loader holds Redis's latest; at most one second after ``started``."""
    version = snapshot_store.latest_version(client, prefix=prefix)
    assert version is not None
    remaining = 1.0 - (time.monotonic() - started)
    snapshot = router.run(router.loader.wait_for_version(version, timeout_s=max(remaining, 0.0)))
    assert time.monotonic() - started < 1.0
    return snapshot


@pytest.fixture
def classes() -> tuple[RequestClass, RequestClass]:
    interactive = interactive_class()
    batch = request_class_create(
        actor=None,
        name="batch",
        priority_band=2,
        ttft_slo_ms=5_000,
        deadline_ms=600_000,
        max_queue_length=10_000,
        shed_order=1,
    )
    return interactive, batch


@pytest.fixture
def tenant(classes: tuple[RequestClass, RequestClass]) -> Tenant:
    return tenant_create(
        actor=None,
        slug="acme",
        name="Acme",
        allowed_classes=classes,
        default_class=classes[0],
        **LIMITS,
    )


@pytest.mark.django_db(transaction=True)
def test_tenant_update_reaches_a_running_loader_within_a_second(
    tenant: Tenant, router: LoaderThread, redis_client: redis.Redis[bytes], prefix: str
) -> None:
    assert router.loader.current.tenants["acme"].limits.rpm == 60
    started = time.monotonic()
    tenant_update(actor=None, tenant=tenant, rpm_limit=120, max_concurrency=9)
    snapshot = wait_for_latest(router, redis_client, prefix, started=started)
    assert snapshot.tenants["acme"].limits.rpm == 120
    assert router.loader.current.tenants["acme"].limits.max_concurrency == 9


@pytest.mark.django_db(transaction=True)
def test_admin_change_form_reaches_a_running_loader_within_a_second(
    tenant: Tenant,
    classes: tuple[RequestClass, RequestClass],
    router: LoaderThread,
    redis_client: redis.Redis[bytes],
    prefix: str,
    admin_client: Client,
) -> None:
    interactive, batch = classes
    form = {
        "name": "Acme",
        "status": "active",
        "weight": "1.0",
        **{field: str(value) for field, value in LIMITS.items()},
        "tpm_limit": "25000",
        "allowed_classes": [str(interactive.pk), str(batch.pk)],
        "default_class": str(batch.pk),
        "_save": "Save",
    }
    started = time.monotonic()
    response = admin_client.post(f"/admin/tenants/tenant/{tenant.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    snapshot = wait_for_latest(router, redis_client, prefix, started=started)
    assert snapshot.tenants["acme"].limits.tpm == 25_000
    assert snapshot.tenants["acme"].default_class == "batch"


@pytest.mark.django_db(transaction=True)
def test_one_publish_per_transaction(
    tenant: Tenant, redis_client: redis.Redis[bytes], prefix: str
) -> None:
    before = publish_current()
    with transaction.atomic():
        tenant_update(actor=None, tenant=tenant, rpm_limit=100)
        tenant_update(actor=None, tenant=tenant, tpm_limit=20_000)
        assert snapshot_store.latest_version(redis_client, prefix=prefix) == before  # not yet
    assert snapshot_store.latest_version(redis_client, prefix=prefix) == before + 1
    limits = latest(redis_client, prefix).tenants["acme"].limits
    assert (limits.rpm, limits.tpm) == (100, 20_000)


@pytest.mark.django_db(transaction=True)
def test_nothing_published_when_the_transaction_rolls_back(
    tenant: Tenant, redis_client: redis.Redis[bytes], prefix: str
) -> None:
    before = publish_current()

    def change_then_fail() -> None:
        with transaction.atomic():
            tenant_update(actor=None, tenant=tenant, rpm_limit=100)
            raise RuntimeError("abort")

    with pytest.raises(RuntimeError, match="abort"):
        change_then_fail()
    assert snapshot_store.latest_version(redis_client, prefix=prefix) == before


@pytest.mark.django_db(transaction=True)
def test_failed_publish_after_commit_keeps_the_change_and_logs(
    tenant: Tenant, settings: Any, prefix: str, caplog: pytest.LogCaptureFixture
) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{closed}/0"
    tenant_update(actor=None, tenant=tenant, rpm_limit=77)  # does not raise
    assert Tenant.objects.get(pk=tenant.pk).rpm_limit == 77
    assert "wait in the outbox and are retried" in caplog.text
    (entry,) = SnapshotOutbox.objects.all()
    assert entry.attempts == 1
    assert entry.last_error.startswith("ConnectionError"), entry.last_error


@pytest.mark.django_db(transaction=True)
def test_concurrent_publishers_keep_versions_in_order(
    tenant: Tenant, redis_client: redis.Redis[bytes], prefix: str
) -> None:
    versions: list[int] = []
    errors: list[BaseException] = []

    def publisher() -> None:
        try:
            versions.extend(publish_current() for _ in range(3))
        except BaseException as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=publisher) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert errors == []
    assert len(set(versions)) == 12
    assert snapshot_store.latest_version(redis_client, prefix=prefix) == max(versions)


@pytest.mark.django_db
def test_publish_snapshot_command_prints_the_version(
    tenant: Tenant, redis_client: redis.Redis[bytes], prefix: str
) -> None:
    out = io.StringIO()
    call_command("publish_snapshot", stdout=out)
    version = snapshot_store.latest_version(redis_client, prefix=prefix)
    assert out.getvalue().strip() == f"published snapshot version {version}"
    assert latest(redis_client, prefix).tenants["acme"].limits.rpm == 60

    out = io.StringIO()
    call_command("publish_snapshot", "--if-changed", stdout=out)
    assert out.getvalue().strip() == "snapshot unchanged; nothing published"


@pytest.mark.django_db
def test_publish_snapshot_command_without_redis_fails_clearly(settings: Any, prefix: str) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    settings.REDIS_URL = f"redis://127.0.0.1:{closed}/0"
    with pytest.raises(CommandError, match="could not publish the snapshot to Redis"):
        call_command("publish_snapshot", stdout=io.StringIO())


@pytest.mark.django_db
def test_snapshot_refresh_republishes_only_changed_content(
    tenant: Tenant, redis_client: redis.Redis[bytes], prefix: str
) -> None:
    assert snapshot_refresh() is not None  # nothing published yet under this prefix
    first = snapshot_store.latest_version(redis_client, prefix=prefix)
    assert snapshot_refresh() is None
    assert services.snapshot_refresh() is None
    assert snapshot_store.latest_version(redis_client, prefix=prefix) == first

    Tenant.objects.filter(pk=tenant.pk).update(rpm_limit=999)  # a write that did not publish
    version = snapshot_refresh.apply().get()
    assert version is not None
    assert version > (first or 0)
    assert latest(redis_client, prefix).tenants["acme"].limits.rpm == 999


@pytest.mark.django_db
def test_snapshot_refresh_replaces_an_unreadable_latest(
    tenant: Tenant, redis_client: redis.Redis[bytes], prefix: str
) -> None:
    version = publish_current()
    redis_client.set(snapshot_store.SnapshotKeys(prefix).version(version), b"{corrupt")
    assert publish_if_changed() == version + 1
