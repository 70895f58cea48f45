"""Connections and caches: Django's psycopg pool instead of persistent connections (ASGI), and
one Redis cache for every control-plane process, so the REST throttle is global (two real
processes share a credential's bucket) and clearing the cache leaves the rest of Redis alone."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.core.cache import cache
from django.db import connection
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory

from apps.common.api_support import CredentialThrottle
from runtime import contract

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
RATE = "3/min"

# What another control-plane process does: two requests with the same management token.
OTHER_PROCESS = textwrap.dedent(
    """
    import django
    django.setup()
    from types import SimpleNamespace
    from rest_framework.request import Request
    from rest_framework.test import APIRequestFactory
    from apps.common.api_support import CredentialThrottle
    request = Request(APIRequestFactory().get("/api/v1/me/"))
    request._authenticator = None
    request.user, request.auth = None, SimpleNamespace(prefix="{prefix}")
    print([CredentialThrottle().allow_request(request, None) for _ in range(2)])
    """
)


@pytest.fixture
def namespace() -> Iterator[str]:
    ns = f"switchyard:test:cache:{uuid.uuid4().hex[:10]}"
    yield ns
    client: redis.Redis[bytes] = redis.Redis.from_url(django_settings.REDIS_URL)
    for key in client.scan_iter(f"{ns}:*"):
        client.delete(key)
    client.close()


def _allow(prefix: str) -> bool:
    request = Request(APIRequestFactory().get("/api/v1/me/"))
    request.user, request.auth = None, SimpleNamespace(prefix=prefix)
    return CredentialThrottle().allow_request(request, None)


@pytest.mark.db
@pytest.mark.django_db
def test_connections_come_from_a_pool_not_persistent() -> None:
    assert django_settings.DATABASES["default"]["CONN_MAX_AGE"] == 0
    assert django_settings.DATABASES["default"]["OPTIONS"]["pool"]["max_size"] >= 1
    with connection.cursor() as cursor:
        cursor.execute("select 1")
    assert connection.pool is not None


def test_two_processes_share_one_throttle_bucket(settings: Any, namespace: str) -> None:
    settings.CACHES = {
        "default": {**django_settings.CACHES["default"], "KEY_PREFIX": f"{namespace}:django"}
    }
    settings.REST_FRAMEWORK = {
        **django_settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"api": RATE},
    }
    prefix = f"tok{uuid.uuid4().hex[:8]}"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "DJANGO_SETTINGS_MODULE": "config.settings",
        contract.ENV_SNAPSHOT_PREFIX: f"{namespace}:snapshot",  # the cache's KEY_PREFIX
        "SWITCHYARD_API_RATE": RATE,
    }
    done = subprocess.run(
        [sys.executable, "-c", OTHER_PROCESS.format(prefix=prefix)],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[True, True]"
    assert _allow(prefix)  # the third of 3/min, counted across both processes
    assert not _allow(prefix)
    assert _allow(f"{prefix}-other")  # another credential has its own bucket


def test_clearing_the_cache_deletes_only_its_own_keys(settings: Any, namespace: str) -> None:
    settings.CACHES = {
        "default": {**django_settings.CACHES["default"], "KEY_PREFIX": f"{namespace}:django"}
    }
    client: redis.Redis[bytes] = redis.Redis.from_url(django_settings.REDIS_URL)
    try:
        client.set(f"{namespace}:snapshot:latest", b"7")
        cache.set("a", 1)
        cache.set("b", 2, version=2)
        assert cache.get("a") == 1
        cache.clear()
        assert cache.get("a") is None
        assert cache.get("b", version=2) is None
        assert client.get(f"{namespace}:snapshot:latest") == b"7"
    finally:
        client.close()
