"""Copying the routers' API-key last-use times (a Redis hash) into PostgreSQL."""

from __future__ import annotations

import datetime as dt

from django.conf import settings

from apps.tenants.services.api_keys import api_key_touch
from runtime import redis_conn

# Delete a field only if it still holds the value we copied (a newer use survives).
_DELETE_IF_UNCHANGED = """
local n = 0
for i = 1, #ARGV, 2 do
  if redis.call('HGET', KEYS[1], ARGV[i]) == ARGV[i + 1] then
    redis.call('HDEL', KEYS[1], ARGV[i])
    n = n + 1
  end
end
return n
"""


def api_key_usage_sync() -> int:
    """Touch each key the routers saw in use, then delete the copied entries from the hash
    (those still unchanged). Returns how many keys were touched."""
    client = redis_conn.from_url(settings.REDIS_URL)
    try:
        entries: dict[bytes, bytes] = client.hgetall(settings.API_KEY_USAGE_HASH)
        for prefix, stamp in entries.items():
            used_at = dt.datetime.fromtimestamp(float(stamp), tz=dt.UTC)
            api_key_touch(prefix=prefix.decode(), used_at=used_at)
        if entries:
            flat = [part for pair in entries.items() for part in pair]
            client.eval(_DELETE_IF_UNCHANGED, 1, settings.API_KEY_USAGE_HASH, *flat)  # type: ignore[no-untyped-call]
        return len(entries)
    finally:
        client.close()
