"""Celery beat without a single point: any number of beat processes, exactly one schedules.

``CELERY_BEAT_SCHEDULER = "config.beat_lock:LeasedScheduler"``. Every beat process runs the
same schedule, but only the holder of a Redis lease (``{ns}:beat:lease``, ``ns`` the snapshot
namespace) sends due tasks; the others stand by and try to take the lease every
:data:`STANDBY_POLL_S`. The holder renews it once a second (one Lua call that also writes the
heartbeat ``{ns}:beat:heartbeat``: Redis server time and the holder, what the beat-silence
alert reads) and stops sending as soon as a renewal fails or finds another holder.

Failover bound: the lease lives ``SWITCHYARD_BEAT_LEASE_S`` (default 10 s) past its last renewal,
so after a kill -9 of the scheduling beat a standby sends again within lease + standby poll
(10 + 1 s by default). A beat stopped cleanly (SIGTERM, Ctrl-C) gives the lease back at once
and a standby takes over within the standby poll. Overlap is possible only when a holder is
stuck longer than the lease inside one send (a hung broker): the periodic tasks are idempotent
for that reason (and because a backlog of them may run at once on a worker).

The schedule is kept in memory (the base Celery ``Scheduler``): a beat that takes over sends
every entry once at once (the previous holder's last sends are unknown), then on its interval.
"""

from __future__ import annotations

import logging
import os
import socket
import time
import uuid
from typing import Any, Final

import redis
from celery.beat import Scheduler
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.exceptions import RedisError

from config import secret_key
from runtime import contract, redis_conn

logger = logging.getLogger(__name__)

ENV_LEASE_S: Final = "SWITCHYARD_BEAT_LEASE_S"
DEFAULT_LEASE_S: Final = 10.0
RENEW_EVERY_S: Final = 1.0
STANDBY_POLL_S: Final = 1.0

# KEYS: lease, heartbeat. ARGV: holder, ttl ms, release (1: give the lease back if ours).
# Returns 1 while ``holder`` holds the lease (the heartbeat is written), else 0.
_HOLD_LUA: Final = """
if ARGV[3] == '1' then
  if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
  return 0
end
local held = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  held = 1
elseif redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  held = 1
end
if held == 1 then
  local now = redis.call('TIME')
  redis.call('SET', KEYS[2], now[1] .. '.' .. string.format('%06d', now[2]) .. ' ' .. ARGV[1])
end
return held
"""


def lease_key(namespace: str) -> str:
    return f"{namespace}:beat:lease"


def heartbeat_key(namespace: str) -> str:
    return f"{namespace}:beat:heartbeat"


def beat_namespace() -> str:
    return contract.namespace_of(str(settings.SNAPSHOT_REDIS_PREFIX))


def lease_seconds() -> float:
    raw = os.environ.get(ENV_LEASE_S, "10").strip() or str(DEFAULT_LEASE_S)
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{ENV_LEASE_S}={raw!r} is not a number of seconds") from None
    if value < 2 * RENEW_EVERY_S:
        raise ValueError(f"{ENV_LEASE_S}={raw!r}: the lease must be at least {2 * RENEW_EVERY_S} s")
    return value


class BeatLease:
    """The Redis lease one beat holds while it schedules (plus the heartbeat it writes)."""

    def __init__(self, client: redis.Redis[bytes], namespace: str, ttl_s: float) -> None:
        self._client = client
        self._keys = [lease_key(namespace), heartbeat_key(namespace)]
        self.ttl_s = ttl_s
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._script = client.register_script(_HOLD_LUA)

    def hold(self) -> bool:
        """Renew the lease, or take it when free; True while this beat holds it."""
        held = self._script(keys=self._keys, args=[self.holder, int(self.ttl_s * 1000), 0])
        return bool(held)

    def release(self) -> None:
        self._script(keys=self._keys, args=[self.holder, 0, 1])


class LeasedScheduler(Scheduler):
    """Celery's in-memory scheduler, sending only while it holds the beat lease."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("lazy"):
            try:
                secret_key.require()  # no SECRET_KEY outside DEBUG: refuse to start, naming it
            except ImproperlyConfigured as exc:
                raise SystemExit(f"celery beat: {exc}") from None
        self._lease: BeatLease | None = None
        self._leading = False
        self._said: bool | None = None  # the state last logged
        self._checked_at = float("-inf")  # monotonic time of the last successful renewal
        super().__init__(*args, **kwargs)

    def _beat_lease(self) -> BeatLease:
        if self._lease is None:
            client: redis.Redis[bytes] = redis_conn.from_url(
                settings.REDIS_URL, socket_connect_timeout=1.0, socket_timeout=2.0
            )
            self._lease = BeatLease(client, beat_namespace(), lease_seconds())
        return self._lease

    def _holds(self) -> bool:
        now = time.monotonic()
        if self._leading and now - self._checked_at < RENEW_EVERY_S:
            return True
        lease = self._beat_lease()
        try:
            held = lease.hold()
        except (RedisError, OSError) as exc:
            if self._leading:
                logger.warning("beat: lease not renewed (%r); not scheduling until it is", exc)
            held = False
        if held:
            self._checked_at = now
        if held != self._said:
            self._said = held
            logger.warning(
                "beat: %s (%s, lease %.0f s)",
                "holding the lease: scheduling" if held else "standing by: another beat schedules",
                lease.holder,
                lease.ttl_s,
            )
        self._leading = held
        return held

    def tick(self, *args: Any, **kwargs: Any) -> float:
        if not self._holds():
            return STANDBY_POLL_S
        interval: float = super().tick(*args, **kwargs)
        return min(interval, RENEW_EVERY_S)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self._lease is not None and self._leading:
                try:
                    self._lease.release()
                except (RedisError, OSError) as exc:
                    logger.warning("beat: lease not released (%r); it expires on its own", exc)
                self._leading = False
