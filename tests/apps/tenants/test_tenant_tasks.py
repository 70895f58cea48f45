"""The API-key last-use copy: Redis hash written by routers → PostgreSQL."""

from __future__ import annotations

import datetime as dt
import uuid

import pytest
import redis
from django.conf import settings

from apps.tenants.services import api_key_create
from apps.tenants.tasks import api_keys_sync_last_used

pytestmark = [pytest.mark.db, pytest.mark.integration, pytest.mark.django_db]


@pytest.fixture
def usage_hash(settings):
    settings.API_KEY_USAGE_HASH = f"test:apikey:last_used:{uuid.uuid4().hex}"
    client = redis.Redis.from_url(settings.REDIS_URL)
    yield client, settings.API_KEY_USAGE_HASH
    client.delete(settings.API_KEY_USAGE_HASH)
    client.close()


def test_copies_last_use_and_clears_copied_fields(tenant, usage_hash):
    client, key = usage_hash
    api_key, _ = api_key_create(actor=None, tenant=tenant, name="k")
    used = dt.datetime(2026, 11, 1, 12, 0, tzinfo=dt.UTC)
    client.hset(key, api_key.prefix, str(used.timestamp()))

    assert api_keys_sync_last_used() == 1

    api_key.refresh_from_db()
    assert api_key.last_used_at == used
    assert client.hlen(key) == 0


def test_never_moves_last_use_backwards(tenant, usage_hash):
    client, key = usage_hash
    api_key, _ = api_key_create(actor=None, tenant=tenant, name="k")
    newer = dt.datetime(2026, 11, 2, tzinfo=dt.UTC)
    api_key.last_used_at = newer
    api_key.save(update_fields=["last_used_at"])
    client.hset(key, api_key.prefix, str((newer - dt.timedelta(days=1)).timestamp()))

    api_keys_sync_last_used()

    api_key.refresh_from_db()
    assert api_key.last_used_at == newer


def test_empty_hash_is_a_no_op(usage_hash):
    assert api_keys_sync_last_used() == 0
    assert settings.API_KEY_USAGE_HASH.startswith("test:")
