"""Zero retention switched on: what the data plane kept for the tenant goes at once.

The tenant's cached completions and idempotency records (sealed in Redis) are deleted after the
change commits, and every router drops its in-process copies (the purge channel). Redis being
unreachable then is logged: the entries still expire with their TTL (the model's cache TTL,
24 hours for idempotency records) and the routers neither read nor write more of them from
the snapshot that carries the switch.
"""

from __future__ import annotations

import logging

import redis
from django.conf import settings
from django.db import transaction
from redis.exceptions import RedisError

from runtime import redis_conn
from runtime.cache.purge import cache_purge, idempotency_purge
from runtime.contract import namespace_of

logger = logging.getLogger(__name__)


def tenant_forget_retained(slug: str) -> int:
    """Delete ``slug``'s cached completions and idempotency records; how many went."""
    namespace = namespace_of(settings.SNAPSHOT_REDIS_PREFIX)
    client: redis.Redis[bytes] = redis_conn.from_url(
        settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2
    )
    try:
        removed = cache_purge(client, namespace=namespace, tenant=slug)
        removed += idempotency_purge(client, namespace=namespace, tenant=slug)
    finally:
        client.close()
    logger.info("zero retention for %s: %d stored entries deleted", slug, removed)
    return removed


def tenant_forget_on_commit(slug: str) -> None:
    """:func:`tenant_forget_retained` once the current transaction commits (logged if Redis
    cannot be reached then)."""

    def forget() -> None:
        try:
            tenant_forget_retained(slug)
        except (RedisError, OSError) as exc:
            logger.warning("zero retention for %s: stored entries not deleted now (%s); they "
                           "expire with their TTL", slug, exc)  # fmt: skip

    transaction.on_commit(forget)
