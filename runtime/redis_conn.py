"""One way to build Redis clients for the runtime, so they all survive a Redis restart.

A pooled connection opened before Redis restarted is dead, but the client only finds out
when it next uses it; with several pooled connections, each one fails once in turn, and a
caller that falls back on failure (admission's local limits) falls back once per dead
connection. The clients built here avoid that three ways:

- ``health_check_interval``: a connection idle longer than this is PINGed before its next
  command, and a failed PING drops it and reconnects (the retry below) instead of failing
  the command;
- ``retry``: a command that fails with a *connection* error is retried once on a fresh
  connection (not on a timeout: a slow Redis is not made slower, and a timed-out script
  may have run);
- TCP keepalive: a silently dead peer (host gone, no RST) is noticed in about 25 s.

Callers that must see every drop (the snapshot follower's pub/sub, which re-reads the
latest pointer after a reconnect) pass ``retries=0``.

**Sentinel.** A URL of the form ``redis+sentinel://[[user]:password@]host:port[,host:port...]
/<master>[/<db>]`` names a Redis primary through its Sentinels: the clients built here (and
:func:`from_url`, :func:`sync_pool_from_url` for code that took ``redis.Redis.from_url``) ask a
Sentinel for the primary's address on every new connection, so after a failover the retry above
reconnects to the promoted replica. The password is the primary's; the Sentinels are asked
without one. Any other URL is handed to redis-py unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote

import redis
import redis.asyncio as aioredis
import redis.asyncio.sentinel as aiosentinel
import redis.sentinel as syncsentinel
from redis.asyncio.retry import Retry as AsyncRetry
from redis.backoff import ExponentialBackoff, NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry as SyncRetry

logger = logging.getLogger(__name__)

HEALTH_CHECK_INTERVAL_S: Final = 5
"""Seconds a pooled connection may sit idle before it is PINGed ahead of its next command."""

_KEEPALIVE: Final = {"TCP_KEEPIDLE": 10, "TCP_KEEPINTVL": 5, "TCP_KEEPCNT": 3}


def keepalive_options() -> dict[int, int | bytes]:
    """TCP keepalive so a silently dead connection is noticed in about 25 s, not minutes."""
    return {getattr(socket, n): v for n, v in _KEEPALIVE.items() if hasattr(socket, n)}


SENTINEL_SCHEME: Final = "redis+sentinel"


@dataclass(frozen=True)
class SentinelTarget:
    """A Redis primary named through Sentinel: where the Sentinels listen and what they call it."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None


def sentinel_target(url: str) -> SentinelTarget | None:
    """The Sentinel target a ``redis+sentinel://`` URL names; None for any other URL.

    Raises ValueError (naming the expected form) for a malformed Sentinel URL."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() != SENTINEL_SCHEME:
        return None
    form = f"{SENTINEL_SCHEME}://[[user]:password@]host:port[,host:port...]/<master>[/<db>]"
    netloc, _, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    username = password = None
    if at:
        user, _, secret = userinfo.partition(":")
        username, password = unquote(user) or None, unquote(secret) or None
    sentinels: list[tuple[str, int]] = []
    for item in hosts.split(","):
        host, colon, port = item.strip().rpartition(":")
        if not colon or not host or not port.isdigit():
            raise ValueError(f"bad Sentinel address {item!r} in {SENTINEL_SCHEME} URL; want {form}")
        sentinels.append((host.strip("[]"), int(port)))
    parts = [p for p in path.split("?")[0].split("/") if p]
    if not parts or len(parts) > 2 or (len(parts) == 2 and not parts[1].isdigit()):
        raise ValueError(f"{SENTINEL_SCHEME} URL needs /<master>[/<db>]; want {form}")
    db = int(parts[1]) if len(parts) == 2 else 0
    return SentinelTarget(tuple(sentinels), unquote(parts[0]), db, username, password)


def _sentinel_kwargs(timeout_s: float, connect_timeout_s: float) -> dict[str, Any]:
    return {"socket_timeout": timeout_s, "socket_connect_timeout": connect_timeout_s}


def _master_kwargs(target: SentinelTarget, kwargs: dict[str, Any]) -> dict[str, Any]:
    return {"db": target.db, "username": target.username, "password": target.password, **kwargs}


def from_url(url: str, **kwargs: Any) -> redis.Redis[bytes]:
    """``redis.Redis.from_url(url, **kwargs)``, that also takes a ``redis+sentinel://`` URL
    (then a client of the current primary, the same ``kwargs`` on its connections)."""
    target = sentinel_target(url)
    if target is None:
        client: redis.Redis[bytes] = redis.Redis.from_url(url, **kwargs)
        return client
    pool = sync_pool_from_url(url, **kwargs)
    master: redis.Redis[bytes] = redis.Redis.from_pool(pool)  # type: ignore[attr-defined]
    return master


def sync_pool_from_url(url: str, **kwargs: Any) -> redis.ConnectionPool:
    """``redis.ConnectionPool.from_url``, that also takes a ``redis+sentinel://`` URL (the
    Django cache's ``pool_class`` hook, config/cache.py)."""
    target = sentinel_target(url)
    if target is None:
        return redis.ConnectionPool.from_url(url, **kwargs)
    sentinel = syncsentinel.Sentinel(
        list(target.sentinels),
        sentinel_kwargs=_sentinel_kwargs(
            kwargs.get("socket_timeout") or 5.0, kwargs.get("socket_connect_timeout") or 2.0
        ),
    )
    return syncsentinel.SentinelConnectionPool(
        target.master, sentinel, is_master=True, **_master_kwargs(target, kwargs)
    )


def _backoff(retries: int) -> ExponentialBackoff | NoBackoff:
    return ExponentialBackoff(cap=0.05, base=0.005) if retries else NoBackoff()


def async_client(
    url: str,
    *,
    name: str,
    timeout_s: float = 1.0,
    connect_timeout_s: float | None = None,
    retries: int = 1,
    health_check_interval_s: int = HEALTH_CHECK_INTERVAL_S,
) -> aioredis.Redis[bytes]:
    """An asyncio Redis client for ``url`` (bytes replies) named ``name`` in CLIENT LIST."""
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    connect_s = timeout_s if connect_timeout_s is None else connect_timeout_s
    options: dict[str, Any] = {
        "socket_connect_timeout": connect_s,
        "socket_timeout": timeout_s,
        "socket_keepalive": True,
        "socket_keepalive_options": keepalive_options(),
        "health_check_interval": health_check_interval_s,
        "retry": AsyncRetry(_backoff(retries), retries, supported_errors=(RedisConnectionError,)),
        "client_name": name,
    }
    target = sentinel_target(url)
    if target is None:
        client: aioredis.Redis[bytes] = aioredis.Redis.from_url(url, **options)
        return client
    sentinel = aiosentinel.Sentinel(
        list(target.sentinels), sentinel_kwargs=_sentinel_kwargs(timeout_s, connect_s)
    )
    master: aioredis.Redis[bytes] = sentinel.master_for(
        target.master, **_master_kwargs(target, options)
    )
    return master


def sync_client(
    url: str,
    *,
    name: str,
    timeout_s: float = 5.0,
    connect_timeout_s: float | None = None,
    retries: int = 1,
    health_check_interval_s: int = HEALTH_CHECK_INTERVAL_S,
) -> redis.Redis[bytes]:
    """The blocking twin of :func:`async_client`, for the control plane and commands."""
    if retries < 0:
        raise ValueError(f"retries must be >= 0, got {retries}")
    return from_url(
        url,
        socket_connect_timeout=timeout_s if connect_timeout_s is None else connect_timeout_s,
        socket_timeout=timeout_s,
        socket_keepalive=True,
        socket_keepalive_options=keepalive_options(),
        health_check_interval=health_check_interval_s,
        retry=SyncRetry(_backoff(retries), retries, supported_errors=(RedisConnectionError,)),
        client_name=name,
    )


# -- cancellation ------------------------------------------------------------------------------
# redis-py's asyncio client can swallow a task's cancellation mid-read: ``PubSub.get_message``
# with a timeout then returns None (or raises a connection error) instead of CancelledError, and
# a ``while True`` loop around it never ends, so whoever awaits the cancelled task hangs. Loops
# that poll Redis call raise_if_cancelling() after each read; owners stop their tasks with
# cancel_and_wait().

CANCEL_ATTEMPTS: Final = 10
CANCEL_WAIT_S: Final = 1.0


def raise_if_cancelling() -> None:
    """Raise CancelledError when the current task has a cancellation request pending."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


async def cancel_and_wait(
    task: asyncio.Task[None], *, attempts: int = CANCEL_ATTEMPTS, wait_s: float = CANCEL_WAIT_S
) -> bool:
    """Cancel ``task`` until it ends (a swallowed cancellation is asked again), waiting at most
    ``attempts * wait_s`` seconds; True when it ended."""
    for _ in range(attempts):
        task.cancel()
        done, _pending = await asyncio.wait({task}, timeout=wait_s)
        if done:
            if not task.cancelled() and task.exception() is not None:
                logger.error("task %s failed while stopping", task.get_name(),
                             exc_info=task.exception())  # fmt: skip
            return True
    logger.error("task %s did not stop after %d cancellations", task.get_name(), attempts)
    return False
