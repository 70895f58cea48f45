"""The routers' safety interventions -> ``Intervention`` rows and the audit log, exactly once.

Mirrors the usage consumer (:func:`apps.billing.ledger.usage_consume`): a consumer group on
the stream (:func:`runtime.contract.safety_stream`), entries a dead consumer left pending
reclaimed with ``XAUTOCLAIM``, one transaction per batch, acked and deleted after the commit.
An event already written (same ``event_id``) is skipped, so a replay writes nothing twice.
Events carry no content (:class:`runtime.safety.events.Intervention` has no field for it).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec
import redis
from django.conf import settings
from django.db import transaction

from apps.common.audit import audit_record
from apps.safety.models import Intervention
from apps.tenants.models import Tenant
from runtime import redis_conn
from runtime.contract import SAFETY_GROUP, safety_stream
from runtime.safety.events import Intervention as InterventionEvent

logger = logging.getLogger(__name__)
_DECODER = msgspec.json.Decoder(InterventionEvent)


def namespace() -> str:
    return str(settings.SNAPSHOT_REDIS_PREFIX).removesuffix(":snapshot")


def redis_client() -> redis.Redis[bytes]:
    return redis_conn.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2)


def event_id(event: InterventionEvent) -> str:
    """What makes an event unique: its request, stage, action, pack and rule."""
    return ":".join((event.request_id, event.stage, event.action, event.pack, event.rule))[:200]


def _decoded(raw: Iterable[Any]) -> tuple[list[bytes], list[InterventionEvent]]:
    ids: list[bytes] = []
    events: list[InterventionEvent] = []
    for stream_id, fields in raw:
        ids.append(stream_id)
        if fields is None:  # deleted while pending
            continue
        try:
            events.append(_DECODER.decode(fields[b"event"]))
        except (KeyError, msgspec.DecodeError):
            logger.exception("safety stream: dropping malformed entry %r", stream_id)
    return ids, events


def interventions_consume(
    *,
    client: redis.Redis[bytes],
    consumer: str = "audit-1",
    count: int = 500,
    claim_idle_ms: int = 30_000,
) -> int:
    """Write one batch of intervention events; returns how many entries were handled."""
    stream = safety_stream(namespace())
    try:
        client.xgroup_create(stream, SAFETY_GROUP, id="0", mkstream=True)
    except redis.exceptions.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise
    _next, claimed, *_ = client.xautoclaim(
        stream, SAFETY_GROUP, consumer, min_idle_time=claim_idle_ms, start_id="0-0", count=count
    )
    raw = list(claimed)
    if not raw:
        answer = client.xreadgroup(SAFETY_GROUP, consumer, {stream: ">"}, count=count)
        raw = [entry for _name, entries in answer for entry in entries] if answer else []
    if not raw:
        return 0
    ids, events = _decoded(raw)
    interventions_write(events=events)
    pipe = client.pipeline(transaction=True)
    pipe.xack(stream, SAFETY_GROUP, *ids)
    pipe.xdel(stream, *ids)
    pipe.execute()
    return len(ids)


def interventions_write(*, events: list[InterventionEvent]) -> int:
    """Write the events not yet written, each with its audit event; returns how many."""
    if not events:
        return 0
    tenants = {t.slug: t for t in Tenant.objects.filter(slug__in={e.tenant for e in events})}
    written = 0
    with transaction.atomic():
        keys = {event_id(e): e for e in events}
        seen = set(
            Intervention.objects.filter(event_id__in=list(keys)).values_list("event_id", flat=True)
        )
        for key, event in keys.items():
            tenant = tenants.get(event.tenant)
            if tenant is None or key in seen:
                if tenant is None:
                    logger.error("safety event %s: unknown tenant %r", key, event.tenant)
                continue
            row = Intervention.objects.create(
                event_id=key, tenant=tenant, api_key=event.key[:16], model=event.model[:100],
                request_id=event.request_id[:100], stage=event.stage, action=event.action,
                pack=event.pack, rule=event.rule, matches=event.matches, failed=event.failed,
                occurred_at=datetime.fromtimestamp(event.at, tz=UTC),
            )  # fmt: skip
            audit_record(
                actor=None, action=f"safety.{event.stage}.{event.action}", target=row,
                after={"api_key": row.api_key, "model": row.model, "pack": row.pack,
                       "rule": row.rule, "matches": row.matches, "failed": row.failed,
                       "request_id": row.request_id},
            )  # fmt: skip
            written += 1
    return written
