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
"""

from __future__ import annotations

import asyncio
import logging
import socket
from typing import Final

import redis
import redis.asyncio as aioredis
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
    client: aioredis.Redis[bytes] = aioredis.Redis.from_url(
        url,
        socket_connect_timeout=timeout_s if connect_timeout_s is None else connect_timeout_s,
        socket_timeout=timeout_s,
        socket_keepalive=True,
        socket_keepalive_options=keepalive_options(),
        health_check_interval=health_check_interval_s,
        retry=AsyncRetry(_backoff(retries), retries, supported_errors=(RedisConnectionError,)),
        client_name=name,
    )
    return client


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
    client: redis.Redis[bytes] = redis.Redis.from_url(
        url,
        socket_connect_timeout=timeout_s if connect_timeout_s is None else connect_timeout_s,
        socket_timeout=timeout_s,
        socket_keepalive=True,
        socket_keepalive_options=keepalive_options(),  # type: ignore[arg-type]  # stub is wrong
        health_check_interval=health_check_interval_s,
        retry=SyncRetry(_backoff(retries), retries, supported_errors=(RedisConnectionError,)),
        client_name=name,
    )
    return client


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
