"""price_set / credit_grant / budget_set."""

from __future__ import annotations

from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError

from apps.billing.models import Budget, CreditAccount, Price
from apps.billing.selectors import credit_balance, price_for, prices_all
from apps.billing.services import budget_set, credit_grant, price_set
from apps.common.models import AuditEvent

pytestmark = [pytest.mark.db, pytest.mark.django_db]


def errors_of(excinfo: pytest.ExceptionInfo[ValidationError]) -> dict[str, list[str]]:
    return excinfo.value.message_dict


# --- prices ---------------------------------------------------------------------------------


def test_price_set_creates_then_updates(version, admin_user, publishes):
    publishes.reset()
    price = price_set(
        actor=admin_user,
        version=version,
        hardware_tier="cpu",
        input_per_1k="0.5",
        output_per_1k=Decimal("1.5"),
    )
    assert (price.input_per_1k, price.output_per_1k, price.cache_hit_discount) == (
        Decimal("0.5"),
        Decimal("1.5"),
        Decimal("0.5"),
    )
    assert publishes.pending

    again = price_set(
        actor=admin_user,
        version=version,
        hardware_tier="cpu",
        input_per_1k=1,
        output_per_1k=2,
        cache_hit_discount=0,
    )
    assert again.pk == price.pk
    assert Price.objects.count() == 1
    assert price_for(version, "cpu").output_per_1k == Decimal(2)
    first, second = AuditEvent.objects.filter(action="price.set").order_by("id")
    assert first.before is None
    assert second.before["input_per_1k"] == "0.500000"
    assert second.after["cache_hit_discount"] == "0"


def test_price_set_keeps_tiers_apart(version):
    price_set(actor=None, version=version, hardware_tier="cpu", input_per_1k=1, output_per_1k=1)
    price_set(actor=None, version=version, hardware_tier="h100", input_per_1k=3, output_per_1k=3)
    assert [p.hardware_tier for p in prices_all()] == ["cpu", "h100"]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"input_per_1k": Decimal("-0.1")}, "input_per_1k"),
        ({"output_per_1k": -1}, "output_per_1k"),
        ({"input_per_1k": "abc"}, "input_per_1k"),
        ({"input_per_1k": Decimal("NaN")}, "input_per_1k"),
        ({"input_per_1k": Decimal("0.0000001")}, "input_per_1k"),
        ({"output_per_1k": Decimal("1e15")}, "output_per_1k"),
        ({"cache_hit_discount": Decimal("1.01")}, "cache_hit_discount"),
        ({"cache_hit_discount": -0.5}, "cache_hit_discount"),
        ({"cache_hit_discount": Decimal("0.1234")}, "cache_hit_discount"),
        ({"batch_discount": Decimal("1.5")}, "batch_discount"),
        ({"batch_discount": "-0.1"}, "batch_discount"),
        ({"batch_discount": "half"}, "batch_discount"),
        ({"hardware_tier": ""}, "hardware_tier"),
        ({"hardware_tier": "H100 SXM"}, "hardware_tier"),
    ],
)
def test_price_set_refuses_bad_values(version, overrides, field):
    values = {"hardware_tier": "cpu", "input_per_1k": 1, "output_per_1k": 1, **overrides}
    with pytest.raises(ValidationError) as excinfo:
        price_set(actor=None, version=version, **values)
    assert field in errors_of(excinfo)
    assert not Price.objects.exists()


# --- credits --------------------------------------------------------------------------------


def test_credit_grant_opens_the_account_and_adds(tenant, admin_user):
    assert credit_balance(tenant) == Decimal(0)
    credit_grant(actor=admin_user, tenant=tenant, amount=Decimal("100"), reason="welcome credit")
    account = credit_grant(actor=admin_user, tenant=tenant, amount="25.5", reason="top-up")

    assert account.balance == Decimal("125.5")
    assert credit_balance(tenant) == Decimal("125.5")
    assert CreditAccount.objects.count() == 1
    last = AuditEvent.objects.filter(action="credit.grant").order_by("-id").first()
    assert last.before == {"balance": "100.000000"}
    assert last.after == {"balance": "125.500000", "amount": "25.5", "reason": "top-up"}


def test_credit_grant_negative_correction(tenant):
    credit_grant(actor=None, tenant=tenant, amount=50, reason="grant")
    account = credit_grant(actor=None, tenant=tenant, amount=-20, reason="granted twice by mistake")
    assert account.balance == Decimal(30)


def test_credit_grant_refuses_to_go_below_zero(tenant):
    credit_grant(actor=None, tenant=tenant, amount=10, reason="grant")
    with pytest.raises(ValidationError) as excinfo:
        credit_grant(actor=None, tenant=tenant, amount=-10.01, reason="too much")
    assert "may not go below 0" in errors_of(excinfo)["amount"][0]
    assert credit_balance(tenant) == Decimal(10)


def test_credit_grant_negative_on_a_new_account_is_refused(tenant):
    with pytest.raises(ValidationError, match="may not go below 0"):
        credit_grant(actor=None, tenant=tenant, amount=-1, reason="oops")


@pytest.mark.parametrize(
    ("amount", "reason", "field"),
    [
        (0, "nothing", "amount"),
        ("lots", "bad", "amount"),
        (Decimal("Infinity"), "bad", "amount"),
        (Decimal("0.0000001"), "too precise", "amount"),
        (10, "", "reason"),
        (10, "   ", "reason"),
    ],
)
def test_credit_grant_refuses_bad_input(tenant, amount, reason, field):
    with pytest.raises(ValidationError) as excinfo:
        credit_grant(actor=None, tenant=tenant, amount=amount, reason=reason)
    assert field in errors_of(excinfo)
    assert not AuditEvent.objects.filter(action="credit.grant").exists()


def test_credit_grant_refuses_overflowing_the_balance(tenant):
    credit_grant(actor=None, tenant=tenant, amount=Decimal("99999999999999"), reason="max")
    with pytest.raises(ValidationError, match="exceed the largest amount"):
        credit_grant(actor=None, tenant=tenant, amount=1, reason="one more")


# --- budgets --------------------------------------------------------------------------------


def test_budget_set_creates_then_replaces(tenant, admin_user):
    budget_set(
        actor=admin_user, tenant=tenant, period="month", soft_alert_pct=80, hard_cap=Decimal(1000)
    )
    budget = budget_set(
        actor=admin_user, tenant=tenant, period="month", soft_alert_pct=90, hard_cap="1500"
    )
    budget_set(actor=admin_user, tenant=tenant, period="day", soft_alert_pct=50, hard_cap=100)

    assert (budget.soft_alert_pct, budget.hard_cap) == (90, Decimal(1500))
    assert Budget.objects.filter(tenant=tenant).count() == 2
    events = AuditEvent.objects.filter(action="budget.set").order_by("id")
    assert events[0].before is None
    assert events[1].before == {
        "period": "month",
        "soft_alert_pct": 80,
        "hard_cap": "1000.000000",
        "webhook_url": "",
    }


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"period": "week"}, "period"),
        ({"soft_alert_pct": 0}, "soft_alert_pct"),
        ({"soft_alert_pct": 101}, "soft_alert_pct"),
        ({"soft_alert_pct": 50.5}, "soft_alert_pct"),
        ({"hard_cap": 0}, "hard_cap"),
        ({"hard_cap": Decimal("-5")}, "hard_cap"),
        ({"hard_cap": "many"}, "hard_cap"),
    ],
)
def test_budget_set_refuses_bad_values(tenant, overrides, field):
    values = {"period": "month", "soft_alert_pct": 80, "hard_cap": 100, **overrides}
    with pytest.raises(ValidationError) as excinfo:
        budget_set(actor=None, tenant=tenant, **values)
    assert field in errors_of(excinfo)
    assert not Budget.objects.exists()
