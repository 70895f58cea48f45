"""The billing admin writes through the services and shows their refusals as form errors."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.urls import reverse

from apps.billing.models import Budget, BudgetAlert, CreditAccount, Price, UsageRecord
from apps.billing.services import credit_grant, usage_record_create
from apps.common.models import AuditEvent

pytestmark = [pytest.mark.db, pytest.mark.django_db]


@pytest.mark.parametrize("name", ["price", "creditaccount", "budget", "usagerecord"])
def test_changelists_render(admin_client, name):
    assert admin_client.get(reverse(f"admin:billing_{name}_changelist")).status_code == 200


def test_negative_price_is_a_form_error(admin_client, version):
    form = {
        "version": version.pk,
        "hardware_tier": "cpu",
        "input_per_1k": "-1",
        "output_per_1k": "2",
        "cache_hit_discount": "0.5",
        "batch_discount": "0",
    }
    response = admin_client.post(reverse("admin:billing_price_add"), form)
    assert response.status_code == 200
    assert "Must not be negative." in response.content.decode()
    assert not Price.objects.exists()

    response = admin_client.post(reverse("admin:billing_price_add"), {**form, "input_per_1k": "1"})
    assert response.status_code == 302
    assert Price.objects.get().input_per_1k == Decimal(1)
    assert AuditEvent.objects.filter(action="price.set").exists()


def test_price_edit_goes_through_the_service(admin_client, version):
    form = {
        "version": version.pk,
        "hardware_tier": "cpu",
        "input_per_1k": "1",
        "output_per_1k": "2",
        "cache_hit_discount": "0.5",
        "batch_discount": "0",
    }
    admin_client.post(reverse("admin:billing_price_add"), form)
    price = Price.objects.get()
    url = reverse("admin:billing_price_change", args=[price.pk])

    values = {"input_per_1k": "3", "output_per_1k": "4", "batch_discount": "0"}
    response = admin_client.post(url, {**values, "cache_hit_discount": "2"})
    assert response.status_code == 200
    assert "Cache-hit discount must be a fraction from 0 to 1." in response.content.decode()
    response = admin_client.post(
        url, {**values, "cache_hit_discount": "0.25", "batch_discount": "1.5"}
    )
    assert response.status_code == 200
    assert "Batch discount must be a fraction from 0 to 1." in response.content.decode()

    response = admin_client.post(
        url, {**values, "cache_hit_discount": "0.25", "batch_discount": "0.5"}
    )
    assert response.status_code == 302
    price.refresh_from_db()
    assert (price.input_per_1k, price.cache_hit_discount, price.batch_discount) == (
        Decimal(3), Decimal("0.25"), Decimal("0.5"),
    )  # fmt: skip


def test_credit_grant_through_the_admin(admin_client, admin_user, tenant):
    response = admin_client.post(
        reverse("admin:billing_creditaccount_add"),
        {"tenant": tenant.pk, "amount": "100", "reason": "welcome"},
    )
    assert response.status_code == 302
    account = CreditAccount.objects.get(tenant=tenant)
    assert account.balance == Decimal(100)
    assert AuditEvent.objects.get(action="credit.grant").actor_label == admin_user.username

    url = reverse("admin:billing_creditaccount_change", args=[account.pk])
    response = admin_client.post(url, {"amount": "-150", "reason": "correction"})
    assert response.status_code == 200
    assert "may not go below 0" in response.content.decode()

    response = admin_client.post(url, {"amount": "-40", "reason": "correction"})
    assert response.status_code == 302
    account.refresh_from_db()
    assert account.balance == Decimal(60)


def test_credit_grant_needs_a_reason_in_the_admin(admin_client, tenant):
    credit_grant(actor=None, tenant=tenant, amount=5, reason="seed")
    account = CreditAccount.objects.get(tenant=tenant)
    response = admin_client.post(
        reverse("admin:billing_creditaccount_change", args=[account.pk]),
        {"amount": "5", "reason": ""},
    )
    assert response.status_code == 200
    account.refresh_from_db()
    assert account.balance == Decimal(5)


def test_budget_bad_soft_alert_is_a_form_error(admin_client, tenant):
    form = {"tenant": tenant.pk, "period": "month", "soft_alert_pct": "0", "hard_cap": "100"}
    response = admin_client.post(reverse("admin:billing_budget_add"), form)
    assert response.status_code == 200
    assert "Soft alert must be a whole percentage from 1 to 100." in response.content.decode()
    assert not Budget.objects.exists()

    response = admin_client.post(
        reverse("admin:billing_budget_add"), {**form, "soft_alert_pct": "75"}
    )
    assert response.status_code == 302
    assert Budget.objects.get().soft_alert_pct == 75


def test_usage_records_are_read_only(admin_client, tenant):
    usage, _created = usage_record_create(
        event_id="evt-1",
        tenant=tenant,
        request_class="standard",
        tokens_in=1,
        tokens_out=1,
        credits=1,
        cached=False,
        outcome="ok",
        occurred_at=datetime(2026, 11, 1, tzinfo=UTC),
    )
    url = reverse("admin:billing_usagerecord_change", args=[usage.pk])
    assert admin_client.get(url).status_code == 200
    assert admin_client.post(url, {"tokens_in": "0"}).status_code == 403
    assert admin_client.get(reverse("admin:billing_usagerecord_add")).status_code == 403
    delete = reverse("admin:billing_usagerecord_delete", args=[usage.pk])
    assert admin_client.post(delete, {"post": "yes"}).status_code == 403
    assert UsageRecord.objects.get().tokens_in == 1


def test_overdraft_is_set_through_the_admin_without_a_grant(admin_client, tenant, publishes):
    credit_grant(actor=None, tenant=tenant, amount=5, reason="seed")
    account = CreditAccount.objects.get(tenant=tenant)
    url = reverse("admin:billing_creditaccount_change", args=[account.pk])
    response = admin_client.post(url, {"amount": "", "reason": "", "overdraft": "refuse"})
    assert response.status_code == 200  # nothing to do: no amount, overdraft unchanged
    assert "Give an amount" in response.content.decode()
    publishes.reset()
    response = admin_client.post(url, {"amount": "", "reason": "", "overdraft": "batch"})
    assert response.status_code == 302
    account.refresh_from_db()
    assert (account.overdraft, account.balance) == ("batch", Decimal(5))
    assert AuditEvent.objects.filter(action="credit.overdraft").exists()
    assert publishes.pending


def test_budget_alerts_are_listed_read_only(admin_client, tenant):
    budget = Budget.objects.create(tenant=tenant, period="day", soft_alert_pct=50, hard_cap=10)
    BudgetAlert.objects.create(
        budget=budget, period_start="2026-11-22", spent=Decimal(6), threshold=Decimal(5)
    )
    response = admin_client.get(reverse("admin:billing_budgetalert_changelist"))
    assert response.status_code == 200
    assert "2026" in response.content.decode()
    assert admin_client.get(reverse("admin:billing_budgetalert_add")).status_code == 403
