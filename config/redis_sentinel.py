"""Redis through Sentinel for the control plane's libraries: REDIS_URL (or
SWITCHYARD_CACHE_URL) of the form ``redis+sentinel://host:port,host:port/<master>[/<db>]``
(runtime/redis_conn.py parses it) translated into what each library takes.

- the Django cache: the URL as a one-item LOCATION list and ``OPTIONS["pool_class"]``
  (:class:`SentinelAwarePool`), whose ``from_url`` builds a Sentinel-managed pool;
- Celery's broker and result backend: kombu's ``sentinel://h:p/<db>;sentinel://h:p/<db>`` URL with
  ``master_name`` in the transport options;
- the channel layer: channels_redis's ``{"sentinels": [...], "master_name": ...}`` host.

For any other URL each function returns today's value unchanged.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import redis

from runtime.redis_conn import SentinelTarget, sentinel_target, sync_pool_from_url


class SentinelAwarePool:
    """Django's RedisCache ``pool_class``: only ``from_url`` is called on it."""

    @staticmethod
    def from_url(url: str, **options: Any) -> redis.ConnectionPool:
        return sync_pool_from_url(url, **options)


def cache_location(url: str) -> dict[str, Any]:
    """The Django cache's LOCATION and OPTIONS for ``url``. A Sentinel URL is given as a
    one-item list: Django splits a LOCATION string at commas (one server each)."""
    if sentinel_target(url) is None:
        return {"LOCATION": url}
    return {"LOCATION": [url], "OPTIONS": {"pool_class": f"{__name__}.SentinelAwarePool"}}


def _kombu_url(target: SentinelTarget) -> str:
    auth = ""
    if target.password is not None:
        auth = f"{quote(target.username or '', safe='')}:{quote(target.password, safe='')}@"
    # Celery's result backend reads db and password from the first address, kombu from each.
    return ";".join(f"sentinel://{auth}{h}:{p}/{target.db}" for h, p in target.sentinels)


def celery_url(url: str) -> str:
    """A broker / result-backend URL Celery understands for ``url``."""
    target = sentinel_target(url)
    return url if target is None else _kombu_url(target)


def celery_transport_options(url: str) -> dict[str, Any]:
    """``broker_transport_options`` / ``result_backend_transport_options`` for ``url``."""
    target = sentinel_target(url)
    return {} if target is None else {"master_name": target.master}


def channels_host(url: str) -> str | dict[str, Any]:
    """One ``hosts`` entry of the channels_redis layer for ``url``."""
    target = sentinel_target(url)
    if target is None:
        return url
    host: dict[str, Any] = {
        "sentinels": [list(address) for address in target.sentinels],
        "master_name": target.master,
        "db": target.db,
    }
    if target.password is not None:
        host.update(username=target.username, password=target.password)
    return host
