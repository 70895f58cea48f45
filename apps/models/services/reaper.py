"""Reaping endpoints whose worker died without deregistering (no heartbeat in Redis)."""

from __future__ import annotations

import datetime as dt
import logging

from django.conf import settings
from django.utils import timezone
from redis.exceptions import RedisError

from apps.models.models import Endpoint
from apps.models.selectors import endpoints_live
from apps.models.services.fleet import endpoint_set_state
from runtime import redis_conn
from runtime.workers.heartbeat import endpoint_heartbeat_key
from runtime.workers.supervisor import SupervisorSettings

log = logging.getLogger(__name__)

# A worker writes its first heartbeat right after it registers its endpoint and launches the
# engine; an endpoint younger than one TTL may not have beaten yet, so it is never reaped.
HEARTBEAT_TTL_S = SupervisorSettings().heartbeat_ttl_s
_REDIS_TIMEOUT_S = 2.0


def endpoints_reap_stale() -> list[int]:
    """Mark gone the live endpoints whose worker stopped heartbeating.

    An endpoint in state starting, ready or draining, registered more than one heartbeat TTL
    ago, whose key ``switchyard:endpoint:<id>:heartbeat`` is absent from Redis belongs to a
    worker that died without deregistering (SIGKILL, OOM, a lost machine): routers must stop
    sending it traffic. While Redis cannot be read nothing is reaped. Returns the ids marked
    gone.
    """
    cutoff = timezone.now() - dt.timedelta(seconds=HEARTBEAT_TTL_S)
    candidates = list(endpoints_live().filter(created_at__lt=cutoff))
    if not candidates:
        return []
    client = redis_conn.from_url(
        settings.REDIS_URL,
        socket_timeout=_REDIS_TIMEOUT_S,
        socket_connect_timeout=_REDIS_TIMEOUT_S,
    )
    try:
        pipe = client.pipeline(transaction=False)
        for endpoint in candidates:
            pipe.exists(endpoint_heartbeat_key(endpoint.pk))
        alive = pipe.execute()
    except RedisError as exc:
        log.warning("cannot read endpoint heartbeats (%s); reaping nothing", exc)
        return []
    finally:
        client.close()
    reaped: list[int] = []
    for endpoint, beating in zip(candidates, alive, strict=True):
        if beating:
            continue
        endpoint_set_state(actor=None, endpoint=endpoint, state=Endpoint.State.GONE)
        log.warning(
            "endpoint %s at %s has no heartbeat: marked gone", endpoint.pk, endpoint.base_url
        )
        reaped.append(endpoint.pk)
    return reaped
