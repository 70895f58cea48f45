"""The usage stream -> the ledger (exactly once), grants reaching Redis, reconciliation,
budget alerts and the credit settings in the snapshot. Real PostgreSQL and Redis; the usage
events are appended by the routers' own settle script."""

from __future__ import annotations

import http.server
import json
import threading
import time
import uuid
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import pytest
import redis
from django.core.exceptions import ValidationError

from apps.billing import ledger
from apps.billing.alerts import budget_alert_deliver
from apps.billing.ledger import credit_live
from apps.billing.models import BudgetAlert, CreditAccount, UsageRecord
from apps.billing.selectors import credit_balance
from apps.billing.services import budget_set, credit_grant, credit_overdraft_set
from apps.common.models import AuditEvent
from apps.core.selectors import snapshot_build
from apps.tenants.models import Tenant
from runtime.admission.scripts import SETTLE_LUA
from runtime.admission.settle_calls import DONE_TTL_S
from runtime.contract import USAGE_GROUP, credit_key, done_key, period_fields, usage_stream
from runtime.metering.events import UsageEvent, encode_event

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


@pytest.fixture
def capture(django_capture_on_commit_callbacks: Any) -> Any:
    return django_capture_on_commit_callbacks


def grant(tenant: Tenant, amount: str, capture: Any) -> None:
    with capture(execute=True):
        credit_grant(actor=None, tenant=tenant, amount=amount, reason="test")


def settle(client: redis.Redis[bytes], tenant: Tenant, cost_uc: int, **fields: Any) -> str:
    """What a router does when a request that reached an engine ends."""
    lease = uuid.uuid4().hex
    prefix = ledger.limits_prefix()
    base = f"{prefix}:{{{tenant.slug}}}"
    event = UsageEvent(
        id=lease, tenant=tenant.slug, api_key="nokey", version=0, endpoint=None, tier="cpu",
        request_class="standard", tokens_in=10, tokens_out=20, cost_uc=cost_uc, cached=False,
        outcome="ok", occurred_at=time.time(), **fields,
    )  # fmt: skip
    day, month = period_fields()
    keys = [f"{base}:rpm", f"{base}:tpm", f"{base}:conc", credit_key(prefix, tenant.slug),
            f"{base}:escrow", usage_stream(ledger.namespace()),
            done_key(prefix, tenant.slug, lease)]  # fmt: skip
    client.eval(SETTLE_LUA, len(keys), *keys, lease, 0, "0", cost_uc, day, month,  # type: ignore[no-untyped-call]
                encode_event(event).decode(), DONE_TTL_S)  # fmt: skip
    return lease


def test_a_grant_reaches_the_redis_balance_and_is_audited(tenant, capture):
    grant(tenant, "12.5", capture)
    assert credit_live(tenant)["available"] == Decimal("12.5")
    assert AuditEvent.objects.filter(action="credit.grant").count() == 1


def test_usage_is_written_once_and_debits_the_account(tenant, redis_client, capture):
    grant(tenant, "10", capture)
    ids = [settle(redis_client, tenant, 1_500_000) for _ in range(3)]
    assert ledger.usage_consume(client=redis_client) == 3
    assert ledger.usage_consume(client=redis_client) == 0
    assert sorted(UsageRecord.objects.values_list("event_id", flat=True)) == sorted(ids)
    assert credit_balance(tenant) == Decimal("5.5")
    assert credit_live(tenant)["balance"] == Decimal("5.5")
    record = UsageRecord.objects.get(event_id=ids[0])
    assert (record.tokens_in, record.tokens_out, record.credits) == (10, 20, Decimal("1.5"))
    assert redis_client.xlen(usage_stream(ledger.namespace())) == 0  # acked and deleted


def test_a_consumer_dying_after_commit_leaves_no_double_record(tenant, redis_client, capture):
    grant(tenant, "10", capture)
    settle(redis_client, tenant, 1_000_000)
    stream = usage_stream(ledger.namespace())
    ledger.usage_group_ensure(redis_client)
    # Consumer A reads and commits, then dies before its XACK.
    [(_name, entries)] = redis_client.xreadgroup(USAGE_GROUP, "a", {stream: ">"}, count=10)
    ledger.usage_write(events=[(ledger._entries(entries)[0].event, 1_000_000)])  # type: ignore[list-item]
    # Consumer B reclaims the stuck entry: it is acked, not written again.
    assert ledger.usage_consume(client=redis_client, consumer="b", claim_idle_ms=0) == 1
    assert UsageRecord.objects.count() == 1
    assert credit_balance(tenant) == Decimal(9)
    assert redis_client.xpending(stream, USAGE_GROUP)["pending"] == 0


def test_a_consumer_dying_before_commit_loses_nothing(tenant, redis_client, capture):
    grant(tenant, "10", capture)
    settle(redis_client, tenant, 2_000_000)
    stream = usage_stream(ledger.namespace())
    ledger.usage_group_ensure(redis_client)
    redis_client.xreadgroup(USAGE_GROUP, "a", {stream: ">"}, count=10)  # read, then killed
    assert UsageRecord.objects.count() == 0
    assert ledger.usage_consume(client=redis_client, consumer="b", claim_idle_ms=0) == 1
    assert UsageRecord.objects.count() == 1
    assert credit_balance(tenant) == Decimal(8)


def test_reconcile_seeds_a_lost_redis_and_counts_usage_in_flight(tenant, redis_client, capture):
    grant(tenant, "10", capture)
    settle(redis_client, tenant, 3_000_000)  # charged in Redis, not in the ledger yet
    assert ledger.credit_reconcile(client=redis_client) == []  # consistent: nothing to repair
    redis_client.delete(credit_key(ledger.limits_prefix(), tenant.slug))  # Redis lost the balance
    [repair] = ledger.credit_reconcile(client=redis_client)
    assert (repair.redis_uc, repair.expected_uc) == (None, 7_000_000)
    assert credit_live(tenant)["balance"] == Decimal(7)
    ledger.usage_consume(client=redis_client)
    assert ledger.credit_reconcile(client=redis_client) == []
    assert credit_balance(tenant) == Decimal(7)
    audit = AuditEvent.objects.get(action="credit.reconcile")
    assert audit.after["redis_balance"] == "7.000000"


def test_reconcile_repairs_drift_and_records_it(tenant, redis_client, capture):
    grant(tenant, "10", capture)
    redis_client.hincrby(credit_key(ledger.limits_prefix(), tenant.slug), "balance", 250_000)
    [repair] = ledger.credit_reconcile(client=redis_client)
    assert (repair.redis_uc, repair.expected_uc) == (10_250_000, 10_000_000)
    assert credit_live(tenant)["balance"] == Decimal(10)
    audit = AuditEvent.objects.get(action="credit.reconcile")
    assert audit.after["drift"] == "0.250000"


def test_a_soft_alert_fires_once_per_period(tenant, redis_client, capture):
    grant(tenant, "100", capture)
    budget_set(actor=None, tenant=tenant, period="day", soft_alert_pct=50, hard_cap="10")
    settle(redis_client, tenant, 4_000_000)
    ledger.usage_consume(client=redis_client)
    assert not BudgetAlert.objects.exists()  # 4 of 10: below 50 %
    settle(redis_client, tenant, 2_000_000)
    settle(redis_client, tenant, 1_000_000)
    ledger.usage_consume(client=redis_client)
    settle(redis_client, tenant, 1_000_000)
    ledger.usage_consume(client=redis_client)
    [alert] = BudgetAlert.objects.all()
    assert alert.spent == Decimal(7)
    assert alert.threshold == Decimal(5)
    assert AuditEvent.objects.filter(action="budget.alert").count() == 1


@pytest.fixture
def webhook() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            length = int(self.headers["Content-Length"])
            received.append(json.loads(self.rfile.read(length)))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            return

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()
    server.server_close()


def test_a_soft_alert_posts_its_webhook(tenant, redis_client, webhook, capture):
    url, received = webhook
    budget_set(actor=None, tenant=tenant, period="month", soft_alert_pct=10, hard_cap="10",
               webhook_url=url)  # fmt: skip
    settle(redis_client, tenant, 0)  # a free request: no alert
    grant(tenant, "5", capture)
    settle(redis_client, tenant, 2_000_000)
    ledger.usage_consume(client=redis_client)
    alert = BudgetAlert.objects.get()
    assert budget_alert_deliver(alert=alert) == "http 204"
    assert received[0]["tenant"] == tenant.slug
    assert received[0]["spent"] == "2.000000"


def test_budget_refuses_a_webhook_that_is_not_http(tenant):
    with pytest.raises(ValidationError) as refused:
        budget_set(actor=None, tenant=tenant, period="day", soft_alert_pct=80, hard_cap="1",
                   webhook_url="ftp://example.com/x")  # fmt: skip
    assert "webhook_url" in refused.value.message_dict


def test_overdraft_and_caps_reach_the_snapshot(tenant, publishes):
    publishes.reset()
    credit_overdraft_set(actor=None, tenant=tenant, overdraft="batch")
    assert publishes.pending
    publishes.reset()
    budget_set(actor=None, tenant=tenant, period="month", soft_alert_pct=80, hard_cap="25.5")
    assert publishes.pending
    credits = snapshot_build().credits[tenant.slug]
    assert (credits.overdraft, credits.day_cap, credits.month_cap) == ("batch", None, 25.5)
    assert CreditAccount.objects.get(tenant=tenant).overdraft == "batch"
    assert AuditEvent.objects.filter(action="credit.overdraft").exists()


def test_overdraft_setting_is_validated(tenant):
    with pytest.raises(ValidationError):
        credit_overdraft_set(actor=None, tenant=tenant, overdraft="forgive")
