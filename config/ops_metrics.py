"""The control plane's ``GET /metrics``: signals for the background work that otherwise fails
silently, read at scrape time (one Redis round trip of reads, one PostgreSQL aggregate).

- ``switchyard_beat_heartbeat_age_seconds``: since the scheduling beat last renewed its lease
  (config.beat_lock); +Inf when no beat ever held it.
- ``switchyard_usage_backlog_events`` / ``switchyard_usage_oldest_unledgered_age_seconds``:
  usage events in the routers' stream not yet in the ledger (undelivered to the ``ledger``
  consumer group + delivered but not acked) and the age of the oldest (0 when none).
- ``switchyard_credit_reconcile_last_run_age_seconds`` (+Inf: never),
  ``switchyard_credit_reconcile_repairs_total``, ``switchyard_credit_reconcile_drift_credits_total``
  (apps.billing.drift).
- ``switchyard_snapshot_outbox_pending`` / ``switchyard_snapshot_outbox_oldest_age_seconds``:
  committed changes the routers have not been sent yet (0 when none).
- ``switchyard_batch_lines{tenant,model,state}``: the lines of running batches (Batch API) by
  state (pending, claimed, done, failed); ``switchyard_batches_at_risk``: running batches with
  unfinished lines whose completion window ends within the hour.
- ``switchyard_control_source_up{source}``: 0 when Redis / PostgreSQL could not be read (the
  families from that source are then left out, not reported as zero).

Ages use Redis server time (the heartbeat and the reconcile record are stamped with it), the
outbox's the database's clock.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta

import redis
from django.db import DatabaseError
from django.db.models import Count, Min
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry
from redis.exceptions import RedisError

from runtime import redis_conn
from runtime.contract import USAGE_GROUP, usage_stream

logger = logging.getLogger(__name__)

INF = math.inf


@dataclass(frozen=True, slots=True)
class RedisSignals:
    beat_age_s: float
    usage_backlog: int
    usage_oldest_age_s: float
    reconcile_age_s: float
    reconcile_repairs: int
    reconcile_drift_credits: float


@dataclass(frozen=True, slots=True)
class OutboxSignals:
    pending: int
    oldest_age_s: float


def _id_ms(entry_id: bytes | str) -> int:
    raw = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    return int(raw.split("-", 1)[0])


def usage_backlog(client: redis.Redis[bytes], stream: str, now_ms: int) -> tuple[int, float]:
    """(events not yet in the ledger, age in seconds of the oldest; 0 when none)."""
    if not client.exists(stream):
        return 0, 0.0
    names = (USAGE_GROUP, USAGE_GROUP.encode())
    groups = client.xinfo_groups(stream)  # type: ignore[no-untyped-call]
    group = next((g for g in groups if g["name"] in names), None)
    oldest: list[int] = []
    if group is None:  # no consumer ever ran: the whole stream waits
        first = client.xrange(stream, count=1)
        backlog = int(client.xlen(stream))
        if first:
            oldest.append(_id_ms(first[0][0]))
    else:
        pending = client.xpending(stream, USAGE_GROUP)  # type: ignore[no-untyped-call]
        count = int(pending["pending"])
        if count and pending["min"] is not None:
            oldest.append(_id_ms(pending["min"]))
        last = group["last-delivered-id"]
        last_id = last.decode() if isinstance(last, bytes) else str(last)
        undelivered = client.xrange(stream, min=f"({last_id}", count=1)
        if undelivered:
            oldest.append(_id_ms(undelivered[0][0]))
        lag = group.get("lag")
        if lag is None:  # Redis could not tell (entries deleted): count them
            lag = len(client.xrange(stream, min=f"({last_id}", count=100_000))
        backlog = count + int(lag)
    age = max(0.0, (now_ms - min(oldest)) / 1000) if oldest else 0.0
    return backlog, age


def read_redis(client: redis.Redis[bytes], namespace: str) -> RedisSignals:
    from apps.billing.drift import reconcile_totals  # noqa: PLC0415 - apps load after settings
    from config.beat_lock import heartbeat_key  # noqa: PLC0415

    seconds, micros = client.time()
    now = seconds + micros / 1e6
    beat = client.get(heartbeat_key(namespace))
    beat_age = INF if beat is None else max(0.0, now - float(beat.split(b" ", 1)[0]))
    backlog, oldest = usage_backlog(client, usage_stream(namespace), int(now * 1000))
    totals = reconcile_totals(client=client, namespace=namespace)
    return RedisSignals(
        beat_age_s=beat_age,
        usage_backlog=backlog,
        usage_oldest_age_s=oldest,
        reconcile_age_s=INF if totals.last_run is None else max(0.0, now - totals.last_run),
        reconcile_repairs=totals.repairs,
        reconcile_drift_credits=totals.drift_uc / 1_000_000,
    )


def read_outbox() -> OutboxSignals:
    from apps.common.models import SnapshotOutbox  # noqa: PLC0415

    found = SnapshotOutbox.objects.aggregate(pending=Count("pk"), oldest=Min("created_at"))
    oldest = found["oldest"]
    age = 0.0 if oldest is None else max(0.0, (timezone.now() - oldest).total_seconds())
    return OutboxSignals(pending=int(found["pending"]), oldest_age_s=age)


@dataclass(frozen=True, slots=True)
class BatchSignals:
    lines: list[tuple[str, str, str, int]]  # (tenant, model, state, lines)
    at_risk: int


AT_RISK_S = 3600.0


def read_batches() -> BatchSignals:
    from apps.batches.models import Batch, BatchLine  # noqa: PLC0415

    running = (Batch.Status.IN_PROGRESS, Batch.Status.CANCELLING)
    rows = (
        BatchLine.objects.filter(batch__status__in=running)
        .values_list("batch__tenant__slug", "body__model", "state")
        .annotate(n=Count("pk"))
        .order_by()
    )
    soon = timezone.now() + timedelta(seconds=AT_RISK_S)
    at_risk = (
        Batch.objects.filter(status=Batch.Status.IN_PROGRESS, expires_at__lte=soon)
        .filter(lines__state__in=(BatchLine.State.PENDING, BatchLine.State.CLAIMED))
        .distinct()
        .count()
    )
    return BatchSignals(
        lines=[(t, str(m or ""), st, int(n)) for t, m, st, n in rows], at_risk=at_risk
    )


def families(
    redis_part: RedisSignals | None,
    outbox: OutboxSignals | None,
    batches: BatchSignals | None = None,
) -> Iterator[Metric]:
    """The exposition of what was read (None: that source could not be read)."""
    up = GaugeMetricFamily(
        "switchyard_control_source_up",
        "1 when the control plane's /metrics could read this source (redis, postgres).",
        labels=["source"],
    )
    up.add_metric(["redis"], 0.0 if redis_part is None else 1.0)
    up.add_metric(["postgres"], 0.0 if outbox is None else 1.0)
    yield up
    if redis_part is not None:
        r = redis_part
        yield GaugeMetricFamily(
            "switchyard_beat_heartbeat_age_seconds",
            "Seconds since the scheduling Celery beat renewed its lease (+Inf: never).",
            value=r.beat_age_s,
        )
        yield GaugeMetricFamily(
            "switchyard_usage_backlog_events",
            "Usage events in the routers' stream not yet written to the ledger.",
            value=r.usage_backlog,
        )
        yield GaugeMetricFamily(
            "switchyard_usage_oldest_unledgered_age_seconds",
            "Age of the oldest usage event not yet in the ledger (0: none waits).",
            value=r.usage_oldest_age_s,
        )
        yield GaugeMetricFamily(
            "switchyard_credit_reconcile_last_run_age_seconds",
            "Seconds since the credit reconciliation last ran (+Inf: never).",
            value=r.reconcile_age_s,
        )
        yield CounterMetricFamily(
            "switchyard_credit_reconcile_repairs",
            "Tenants whose Redis balance the reconciliation found off the ledger and repaired.",
            value=r.reconcile_repairs,
        )
        yield CounterMetricFamily(
            "switchyard_credit_reconcile_drift_credits",
            "Sum of the differences the reconciliation repaired, in credits.",
            value=r.reconcile_drift_credits,
        )
    if outbox is not None:
        yield GaugeMetricFamily(
            "switchyard_snapshot_outbox_pending",
            "Committed changes not yet published to the routers (snapshot outbox rows).",
            value=outbox.pending,
        )
        yield GaugeMetricFamily(
            "switchyard_snapshot_outbox_oldest_age_seconds",
            "Age of the oldest change waiting in the snapshot outbox (0: none).",
            value=outbox.oldest_age_s,
        )
    if batches is not None:
        lines = GaugeMetricFamily(
            "switchyard_batch_lines",
            "Lines of running batches (Batch API) by tenant, model and state.",
            labels=["tenant", "model", "state"],
        )
        for tenant, model, state, count in batches.lines:
            lines.add_metric([tenant, model, state], count)
        yield lines
        yield GaugeMetricFamily(
            "switchyard_batches_at_risk",
            "Running batches with unfinished lines whose window ends within the hour.",
            value=batches.at_risk,
        )


class ControlPlaneCollector(Collector):
    def __init__(self, redis_url: str, namespace: str) -> None:
        self._redis_url = redis_url
        self._namespace = namespace

    def collect(self) -> Iterator[Metric]:
        redis_part: RedisSignals | None = None
        client: redis.Redis[bytes] = redis_conn.from_url(
            self._redis_url, socket_connect_timeout=1.0, socket_timeout=2.0
        )
        try:
            redis_part = read_redis(client, self._namespace)
        except (RedisError, OSError) as exc:
            logger.warning("/metrics: Redis not read: %r", exc)
        finally:
            client.close()
        outbox: OutboxSignals | None = None
        batches: BatchSignals | None = None
        try:
            outbox = read_outbox()
            batches = read_batches()
        except DatabaseError as exc:
            logger.warning("/metrics: PostgreSQL not read: %r", exc)
        yield from families(redis_part, outbox, batches)


def metrics(request: HttpRequest) -> HttpResponse:
    """``GET /metrics`` (Prometheus text format; no authentication, like the router's)."""
    from django.conf import settings  # noqa: PLC0415

    from runtime import contract  # noqa: PLC0415

    registry = CollectorRegistry(auto_describe=False)
    namespace = contract.namespace_of(str(settings.SNAPSHOT_REDIS_PREFIX))
    registry.register(ControlPlaneCollector(str(settings.REDIS_URL), namespace))
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
