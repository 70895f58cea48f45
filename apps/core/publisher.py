"""Publishing the runtime snapshot: build it from the database, hand it to the store.

Publishes are serialised with a PostgreSQL advisory lock (one per snapshot prefix), taken
before the database is read. A later publish therefore always reads a database state at least
as new as an earlier one, and takes a higher version number: the newest version is always the
freshest content, even when many transactions commit at once.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

import msgspec
import redis
from django.conf import settings
from django.db import connection

from apps.core.selectors import snapshot_build
from runtime import snapshot_store
from runtime.redis_conn import sync_client
from runtime.snapshot import Snapshot, content_digest

logger = logging.getLogger(__name__)


def snapshot_prefix() -> str:
    return str(getattr(settings, "SNAPSHOT_REDIS_PREFIX", snapshot_store.DEFAULT_PREFIX))


@contextlib.contextmanager
def _redis_client() -> Iterator[redis.Redis[bytes]]:
    client = sync_client(
        settings.REDIS_URL, name="switchyard-publisher", timeout_s=5.0, connect_timeout_s=2.0
    )
    try:
        client.ping()  # fail fast, before taking the publish lock, when Redis is down
        yield client
    finally:
        client.close()


@contextlib.contextmanager
def _publish_lock(prefix: str) -> Iterator[None]:
    """Session-level advisory lock, held across the database read and the Redis write."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(hashtext(%s))", [f"snapshot-publish:{prefix}"])
    try:
        yield
    finally:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_unlock(hashtext(%s))", [f"snapshot-publish:{prefix}"]
            )


def _published_twin(client: redis.Redis[bytes], prefix: str, snapshot: Snapshot) -> int | None:
    """The latest published version when it says the same as ``snapshot``, else None."""
    try:
        published = snapshot_store.read_latest(client, prefix=prefix)
    except (msgspec.ValidationError, msgspec.DecodeError):
        logger.warning("snapshot: the latest published document is unreadable; republishing")
        return None
    if published is None or content_digest(published) != content_digest(snapshot):
        return None
    return published.version


def _publish(client: redis.Redis[bytes], prefix: str, snapshot: Snapshot) -> int:
    result = snapshot_store.publish(
        client,
        snapshot,
        prefix=prefix,
        ttl_s=int(getattr(settings, "SNAPSHOT_VERSION_TTL_S", snapshot_store.VERSION_TTL_S)),
        keep=int(getattr(settings, "SNAPSHOT_KEEP_VERSIONS", snapshot_store.KEEP_VERSIONS)),
    )
    if result.latest:
        logger.info("snapshot: published version %d", result.version)
    else:
        # Only possible if someone publishes without the lock (another tool, a bad deploy).
        logger.warning("snapshot: version %d lost a race to a newer one", result.version)
    return result.version


def publish_current() -> int:
    """Build the snapshot from the database and publish it; returns its version number."""
    prefix = snapshot_prefix()
    with _redis_client() as client, _publish_lock(prefix):
        return _publish(client, prefix, snapshot_build())


def publish_if_changed() -> int | None:
    """Publish only if what the database says differs from the latest published snapshot.

    Returns the new version, or None when the published one is already current; then that
    version is confirmed current as of the database read (routers measure staleness by it).
    """
    prefix = snapshot_prefix()
    with _redis_client() as client, _publish_lock(prefix):
        read_at = time.time()
        snapshot = snapshot_build()
        twin = _published_twin(client, prefix, snapshot)
        if twin is not None:
            snapshot_store.confirm(client, version=twin, at=read_at, prefix=prefix)
            return None
        return _publish(client, prefix, snapshot)
