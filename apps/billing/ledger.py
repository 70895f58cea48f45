"""Services between the routers' Redis balances and the PostgreSQL ledger (docs/design.md).

The model (amounts in Redis are integer micro-credits, see :mod:`runtime.contract`):

- PostgreSQL is the truth: ``CreditAccount.balance`` = grants - charges written to the ledger.
- Redis holds, per tenant, ``balance`` = the ledger balance - the charges still on their way
  to it (usage events in the stream), and ``escrow`` (held by admitted requests); the routers
  admit against ``available = balance - escrow``.
- A router's settle script charges ``balance`` and appends the usage event in one atomic
  step, so ``redis balance + charges in the stream not yet in the ledger = ledger balance``
  holds at every instant. :func:`credit_reconcile` checks exactly that and repairs drift (a
  lost Redis, a missed grant) by the difference — a correction that commutes with concurrent
  settlements — and records each repair in the audit log. The same service seeds Redis.
- :func:`usage_consume` reads the stream with a consumer group, writes each event as a
  ``UsageRecord`` (unique on the event id) and debits the account in one transaction, then
  acks and deletes the entries; entries a dead consumer left pending are reclaimed with
  ``XAUTOCLAIM`` after ``claim_idle_ms``.
- Grants (:func:`apps.billing.services.credit_grant`) change the ledger and then Redis under
  the ledger lock, which the reconciler takes too, so a grant is never counted twice.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any

import msgspec
import redis
from django.conf import settings
from django.db import transaction

from apps.billing.alerts import budget_alerts_check
from apps.billing.models import CreditAccount, UsageRecord
from apps.billing.selectors import period_starts, usage_totals
from apps.common.audit import audit_record
from apps.models.models import Endpoint, ModelVersion
from apps.tenants.models import ApiKey, Tenant
from runtime import redis_conn
from runtime.contract import USAGE_GROUP, credit_key, ledger_lock, period_fields, usage_stream
from runtime.metering.events import UsageEvent, decode_event
from runtime.metering.pricing import MICRO

logger = logging.getLogger(__name__)

UC = Decimal(MICRO)

# KEYS: the credit hashes of the tenants, then the stream. Returns {balances, entries}: each
# balance (false when unset) and every stream entry, read in one atomic step.
_READ_LUA = """
local balances = {}
for i = 1, #KEYS - 1 do balances[i] = redis.call('HGET', KEYS[i], 'balance') or '' end
return {balances, redis.call('XRANGE', KEYS[#KEYS], '-', '+')}
"""


# -- names and clients -----------------------------------------------------------------------


def namespace() -> str:
    return str(settings.SNAPSHOT_REDIS_PREFIX).removesuffix(":snapshot")


def limits_prefix() -> str:
    """Where the routers keep limits and credits (``SWITCHYARD_LIMITS_PREFIX`` or the
    namespace + ``:limits``, as :class:`runtime.gateway.config.RouterConfig` derives it)."""
    return getattr(settings, "SWITCHYARD_LIMITS_PREFIX", "") or f"{namespace()}:limits"


def redis_client() -> redis.Redis[bytes]:
    return redis_conn.from_url(settings.REDIS_URL, socket_timeout=5, socket_connect_timeout=2)


@contextmanager
def ledger_locked(client: redis.Redis[bytes]) -> Iterator[None]:
    """Serialise grants and reconciliation (the lock expires if its holder dies)."""
    lock = client.lock(ledger_lock(namespace()), timeout=60, blocking_timeout=30)
    if not lock.acquire():
        raise TimeoutError("the ledger lock is held elsewhere; try again")
    try:
        yield
    finally:
        try:
            lock.release()
        except redis.exceptions.LockError:
            logger.warning("ledger lock expired while held")


def to_micro(amount: Decimal) -> int:
    return int((amount * UC).to_integral_value())


def from_micro(micro: int) -> Decimal:
    return (Decimal(micro) / UC).quantize(Decimal("0.000001"))


def redis_balance_add(client: redis.Redis[bytes], *, tenant: Tenant, amount: Decimal) -> None:
    """Move the tenant's Redis balance by ``amount`` (a grant just committed)."""
    client.hincrby(credit_key(limits_prefix(), tenant.slug), "balance", to_micro(amount))


# -- the usage stream -> the ledger ----------------------------------------------------------


class _Entry(msgspec.Struct, frozen=True):
    stream_id: bytes
    event: UsageEvent | None
    charged_uc: int


def _entries(raw: Iterable[Any]) -> list[_Entry]:
    out: list[_Entry] = []
    for stream_id, raw_fields in raw:
        fields = raw_fields
        if fields is None:  # deleted while pending
            out.append(_Entry(stream_id, None, 0))
            continue
        if isinstance(fields, list):  # from a script: a flat [field, value, ...] list
            fields = dict(zip(fields[::2], fields[1::2], strict=True))
        try:
            event = decode_event(fields[b"event"])
            charged = int(fields.get(b"charged", b"0"))
        except (KeyError, ValueError, msgspec.DecodeError):
            logger.exception("usage stream: dropping malformed entry %r", stream_id)
            out.append(_Entry(stream_id, None, 0))
            continue
        out.append(_Entry(stream_id, event, charged))
    return out


def usage_group_ensure(client: redis.Redis[bytes]) -> None:
    try:
        client.xgroup_create(usage_stream(namespace()), USAGE_GROUP, id="0", mkstream=True)
    except redis.exceptions.ResponseError as exc:
        if "BUSYGROUP" not in str(exc):
            raise


def usage_consume(
    *,
    client: redis.Redis[bytes] | None = None,
    consumer: str = "ledger-1",
    count: int = 500,
    block_ms: int | None = None,
    claim_idle_ms: int = 30_000,
) -> int:
    """Write one batch of usage events to the ledger, exactly once; returns how many entries
    were handled. Reclaims entries idle for ``claim_idle_ms`` in another consumer first."""
    client = client or redis_client()
    stream = usage_stream(namespace())
    usage_group_ensure(client)
    _next, claimed, *_ = client.xautoclaim(
        stream, USAGE_GROUP, consumer, min_idle_time=claim_idle_ms, start_id="0-0", count=count
    )
    raw = list(claimed)
    if not raw:
        answer = client.xreadgroup(
            USAGE_GROUP, consumer, {stream: ">"}, count=count, block=block_ms
        )
        raw = [entry for _name, entries in answer for entry in entries] if answer else []
    if not raw:
        return 0
    entries = _entries(raw)
    tenants = usage_write(events=[(e.event, e.charged_uc) for e in entries if e.event])
    ids = [e.stream_id for e in entries]
    pipe = client.pipeline(transaction=True)
    pipe.xack(stream, USAGE_GROUP, *ids)
    pipe.xdel(stream, *ids)
    pipe.execute()
    if tenants:
        budget_alerts_check(tenant_ids=tenants)
    return len(ids)


def usage_stream_ids(client: redis.Redis[bytes]) -> set[str]:
    """The ids of the usage events in the stream now (unread, or read and not yet written)."""
    raw = client.xrange(usage_stream(namespace()), "-", "+")
    return {e.event.id for e in _entries(raw) if e.event is not None}


def usage_write(*, events: list[tuple[UsageEvent, int]]) -> set[int]:
    """Write the events not yet in the ledger and debit their charges, in one transaction.

    Returns the ids of the tenants charged. A replayed event (already recorded) is skipped;
    the account rows are locked first (in id order) so two consumers handling the same event
    serialise and the second sees the first's record.
    """
    if not events:
        return set()
    by_slug = {t.slug: t for t in Tenant.objects.filter(slug__in={e.tenant for e, _ in events})}
    with transaction.atomic():
        for known in sorted(by_slug.values(), key=lambda t: t.pk):
            CreditAccount.objects.get_or_create(tenant=known)
        accounts = {
            a.tenant_id: a
            for a in CreditAccount.objects.select_for_update()
            .filter(tenant__in=by_slug.values())
            .order_by("tenant_id")
        }
        ids = [e.id for e, _ in events]
        seen = set(UsageRecord.objects.filter(event_id__in=ids).values_list("event_id", flat=True))
        keys = _lookup(ApiKey, "prefix", {e.api_key for e, _ in events})
        versions = set(
            ModelVersion.objects.filter(pk__in={e.version for e, _ in events}).values_list(
                "pk", flat=True
            )
        )
        endpoint_ids = {e.endpoint for e, _ in events if e.endpoint is not None}
        endpoints = set(Endpoint.objects.filter(pk__in=endpoint_ids).values_list("pk", flat=True))
        debits: dict[int, Decimal] = defaultdict(Decimal)
        records: list[UsageRecord] = []
        for event, charged in events:
            tenant = by_slug.get(event.tenant)
            if tenant is None or event.id in seen:
                if tenant is None:
                    logger.error("usage event %s: unknown tenant %r", event.id, event.tenant)
                continue
            seen.add(event.id)
            credits = from_micro(charged)
            key = keys.get(event.api_key)
            records.append(
                UsageRecord(
                    event_id=event.id,
                    tenant=tenant,
                    api_key=key if key is not None and key.tenant_id == tenant.pk else None,
                    version_id=event.version if event.version in versions else None,
                    endpoint_id=event.endpoint if event.endpoint in endpoints else None,
                    request_class=event.request_class[:40] or "default",
                    tokens_in=max(0, event.tokens_in),
                    tokens_out=max(0, event.tokens_out),
                    credits=credits,
                    cached=event.cached,
                    queue_ms=event.queue_ms,
                    ttft_ms=event.ttft_ms,
                    total_ms=event.total_ms,
                    outcome=event.outcome
                    if event.outcome in UsageRecord.Outcome.values
                    else UsageRecord.Outcome.ERROR,
                    occurred_at=datetime.fromtimestamp(event.occurred_at, tz=UTC),
                )
            )
            debits[tenant.pk] += credits
        UsageRecord.objects.bulk_create(records)
        for tenant_id, amount in debits.items():
            if amount:
                account = accounts[tenant_id]
                account.balance -= amount
                account.save(update_fields=["balance", "updated_at"])
    return set(debits)


def _lookup(model: Any, field: str, values: set[str]) -> dict[str, Any]:
    return {getattr(obj, field): obj for obj in model.objects.filter(**{f"{field}__in": values})}


# -- reconciliation ----------------------------------------------------------------------------


class Repair(msgspec.Struct, frozen=True):
    tenant: str
    redis_uc: int | None  # None: the key was missing
    expected_uc: int


def credit_reconcile(*, client: redis.Redis[bytes] | None = None) -> list[Repair]:
    """Compare every tenant's Redis balance with the ledger and repair drift; returns the
    repairs (each also recorded in the audit log). Seeds tenants Redis does not know."""
    client = client or redis_client()
    prefix = limits_prefix()
    with ledger_locked(client):
        tenants = list(Tenant.objects.order_by("pk"))
        if not tenants:
            return []
        keys = [credit_key(prefix, t.slug) for t in tenants]
        balances, raw = client.eval(_READ_LUA, len(keys) + 1, *keys, usage_stream(namespace()))  # type: ignore[no-untyped-call]
        entries = [e for e in _entries(raw) if e.event is not None]
        with transaction.atomic():
            recorded = set(
                UsageRecord.objects.filter(
                    event_id__in=[e.event.id for e in entries if e.event]
                ).values_list("event_id", flat=True)
            )
            ledger = dict(CreditAccount.objects.values_list("tenant_id", "balance"))
        pending: dict[str, int] = defaultdict(int)
        for entry in entries:
            assert entry.event is not None
            if entry.event.id not in recorded:
                pending[entry.event.tenant] += entry.charged_uc
        repairs: list[Repair] = []
        for tenant, key, held in zip(tenants, keys, balances, strict=True):
            current = int(held) if held not in (b"", "", None) else None
            expected = to_micro(ledger.get(tenant.pk, Decimal(0))) - pending[tenant.slug]
            if current == expected:
                continue
            client.hincrby(key, "balance", expected - (current or 0))
            if current is None:
                _seed_periods(client, key, tenant, pending[tenant.slug])
            repairs.append(Repair(tenant.slug, current, expected))
        for repair in repairs:
            _audit_repair(repair)
    return repairs


def _seed_periods(client: redis.Redis[bytes], key: str, tenant: Tenant, pending_uc: int) -> None:
    """A lost credit hash: rebuild this day's and month's spend from the ledger."""
    day_field, month_field = period_fields()
    day_start, month_start = period_starts()
    day = to_micro(usage_totals(tenant, day_start)["credits"]) + pending_uc
    month = to_micro(usage_totals(tenant, month_start)["credits"]) + pending_uc
    client.hset(key, mapping={day_field: day, month_field: month})


def _audit_repair(repair: Repair) -> None:
    account, _ = CreditAccount.objects.get_or_create(tenant=Tenant.objects.get(slug=repair.tenant))
    before = None if repair.redis_uc is None else str(from_micro(repair.redis_uc))
    audit_record(
        actor=None,
        action="credit.reconcile",
        target=account,
        before={"redis_balance": before},
        after={
            "redis_balance": str(from_micro(repair.expected_uc)),
            "drift": None
            if repair.redis_uc is None
            else str(from_micro(repair.redis_uc - repair.expected_uc)),
        },
    )


def credit_live(tenant: Tenant, *, client: redis.Redis[bytes] | None = None) -> dict[str, Decimal]:
    """What the routers see now in Redis: balance, escrow, available (credits; zero when
    unset)."""
    client = client or redis_client()
    raw = client.hmget(credit_key(limits_prefix(), tenant.slug), ["balance", "escrow"])
    balance, escrow = (int(v) if v is not None else 0 for v in raw)
    return {
        "balance": from_micro(balance),
        "escrow": from_micro(escrow),
        "available": from_micro(balance - escrow),
    }
