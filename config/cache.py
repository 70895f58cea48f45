"""The Django cache: Redis, shared by every control-plane process (the REST throttle counts
per credential across all of them, not per process).

``NamespacedRedisCache`` is Django's ``RedisCache`` whose ``clear()`` deletes only its own keys
(``KEY_PREFIX:*``, scanned in batches) instead of FLUSHDB: the Redis it lives in also holds the
snapshot, the limits and the usage stream.
"""

from __future__ import annotations

from typing import Any

from django.core.cache.backends.redis import RedisCache

_BATCH = 500


class NamespacedRedisCache(RedisCache):
    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        if not self.key_prefix:
            raise ValueError("NamespacedRedisCache needs a KEY_PREFIX (clear() deletes its keys)")

    def clear(self) -> None:
        client = self._cache.get_client(None, write=True)
        batch: list[bytes] = []
        for key in client.scan_iter(match=f"{self.key_prefix}:*", count=_BATCH):
            batch.append(key)
            if len(batch) >= _BATCH:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
