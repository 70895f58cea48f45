"""The snapshot outbox: written with the change, drained after commit, retried until it lands."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from django.db import transaction
from fixtures.control_plane import TIGHT_LIMITS as LIMITS
from fixtures.private_redis import PrivateRedis

from apps.common.models import SnapshotOutbox
from apps.core import services, tasks
from apps.tenants.models import Tenant
from apps.tenants.services import tenant_create, tenant_suspend
from runtime import snapshot_store
from runtime.redis_conn import sync_client

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]


@pytest.fixture
def prefix(settings: Any, server: PrivateRedis) -> str:
    settings.REDIS_URL = server.url
    settings.SNAPSHOT_REDIS_PREFIX = f"sytest:ops:{uuid.uuid4().hex}:snapshot"
    return str(settings.SNAPSHOT_REDIS_PREFIX)


def latest(server: PrivateRedis, prefix: str) -> int | None:
    with sync_client(server.url, name="test") as client:
        return snapshot_store.latest_version(client, prefix=prefix)


def tenant_status(server: PrivateRedis, prefix: str, slug: str) -> str:
    with sync_client(server.url, name="test") as client:
        snapshot = snapshot_store.read_latest(client, prefix=prefix)
    assert snapshot is not None
    return snapshot.tenants[slug].status


@pytest.mark.django_db(transaction=True)
def test_entry_is_written_with_the_change_and_deleted_once_published(
    server: PrivateRedis, prefix: str
) -> None:
    with transaction.atomic():
        tenant = tenant_create(actor=None, slug="acme", name="Acme", **LIMITS)
        assert SnapshotOutbox.objects.count() == 1  # in the change's own transaction
        tenant_suspend(actor=None, tenant=tenant)
        assert SnapshotOutbox.objects.count() == 1  # one entry per transaction
        assert latest(server, prefix) is None  # nothing published before the commit
    assert SnapshotOutbox.objects.count() == 0
    assert tenant_status(server, prefix, "acme") == "suspended"


@pytest.mark.django_db(transaction=True)
def test_rolled_back_change_leaves_no_entry(server: PrivateRedis, prefix: str) -> None:
    def change_then_fail() -> None:
        with transaction.atomic():
            tenant_create(actor=None, slug="acme", name="Acme", **LIMITS)
            raise RuntimeError("abort")

    with pytest.raises(RuntimeError, match="abort"):
        change_then_fail()
    assert not SnapshotOutbox.objects.exists()
    assert services.snapshot_outbox_drain() == services.OutboxDrain()
    assert latest(server, prefix) is None


@pytest.mark.django_db(transaction=True)
def test_failed_publish_is_retried_until_it_lands(server: PrivateRedis, prefix: str) -> None:
    tenant = tenant_create(actor=None, slug="acme", name="Acme", **LIMITS)
    before = latest(server, prefix)
    server.kill()
    tenant_suspend(actor=None, tenant=tenant)  # commits; its publish fails
    assert Tenant.objects.get(pk=tenant.pk).status == "suspended"
    assert tasks.snapshot_outbox_drain.apply().get() is None  # still down
    (entry,) = SnapshotOutbox.objects.all()
    assert entry.attempts == 2
    assert entry.last_attempt_at is not None
    assert entry.last_error.startswith("ConnectionError"), entry.last_error

    server.start()
    version = tasks.snapshot_outbox_drain.apply().get()
    assert version is not None
    assert before is not None
    assert version > before
    assert not SnapshotOutbox.objects.exists()
    assert tenant_status(server, prefix, "acme") == "suspended"
    assert services.snapshot_outbox_drain().version is None  # nothing left to send


@pytest.mark.django_db(transaction=True)
def test_refresh_confirms_an_unchanged_snapshot(server: PrivateRedis, prefix: str) -> None:
    tenant_create(actor=None, slug="acme", name="Acme", **LIMITS)
    version = latest(server, prefix)
    assert tasks.snapshot_refresh.apply().get() is None  # nothing changed
    with sync_client(server.url, name="test") as client:
        confirmed = snapshot_store.parse_confirmation(
            client.get(snapshot_store.SnapshotKeys(prefix).confirmed)
        )
    assert confirmed is not None
    assert confirmed.version == version
