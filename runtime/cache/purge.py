"""Purging cached results by tenant and/or model version, and a tenant's idempotency records
(synchronous: the control plane and the management command call it).

L2 entries are deleted by SCAN over :func:`runtime.contract.cache_entry_pattern` and taken out
of their scope's quota index; then a message on the purge channel makes every router drop its
L1 (L1 holds only a short-lived copy, so a router that misses the message still converges
within ``StoreConfig.l1_ttl_s``).
"""

from __future__ import annotations

from typing import Any

from runtime.contract import (
    cache_entry_pattern,
    cache_entry_scope,
    cache_index_keys,
    cache_purge_channel,
    idempotency_pattern,
)

_BATCH = 500


def cache_purge(
    client: Any, *, namespace: str, tenant: str | None = None, version: str | None = None
) -> int:
    """Delete the entries of ``tenant`` (a slug) and/or ``version`` (a version tag, see
    :func:`runtime.cache.policy.version_tag`); both None purges everything. Returns how many
    entries were deleted. ``client`` is a synchronous ``redis.Redis``."""
    pattern = cache_entry_pattern(namespace, tenant or "*", version or "*")
    removed = 0
    batch: list[bytes] = []

    def flush() -> None:
        nonlocal removed
        if not batch:
            return
        pipe = client.pipeline(transaction=False)
        for key in batch:
            scope = cache_entry_scope(namespace, key.decode())
            index, sizes = cache_index_keys(namespace, scope)
            pipe.delete(key)
            pipe.zrem(index, key)
            pipe.hget(sizes, key)
            pipe.hdel(sizes, key)
        results = pipe.execute()
        pipe = client.pipeline(transaction=False)
        for i, key in enumerate(batch):
            deleted, size = results[4 * i], results[4 * i + 2]
            removed += int(deleted)
            if size is not None:
                scope = cache_entry_scope(namespace, key.decode())
                pipe.hincrby(cache_index_keys(namespace, scope)[1], "__total", -int(size))
        pipe.execute()
        batch.clear()

    for key in client.scan_iter(match=pattern, count=_BATCH):
        batch.append(key)
        if len(batch) >= _BATCH:
            flush()
    flush()
    client.publish(cache_purge_channel(namespace), f"{tenant or '*'} {version or '*'}")
    return removed


def idempotency_purge(client: Any, *, namespace: str, tenant: str) -> int:
    """Delete a tenant's idempotency records (its stored answers); how many went."""
    removed = 0
    batch: list[bytes] = []
    for key in client.scan_iter(match=idempotency_pattern(namespace, tenant), count=_BATCH):
        batch.append(key)
        if len(batch) >= _BATCH:
            removed += int(client.delete(*batch))
            batch.clear()
    if batch:
        removed += int(client.delete(*batch))
    return removed
