"""manage.py grant_credits / credit_spend."""

from __future__ import annotations

import io
import json
from decimal import Decimal

import pytest
from django.core.management import CommandError, call_command

from apps.billing.selectors import credit_balance

pytestmark = [pytest.mark.django_db, pytest.mark.integration]


def test_grant_then_read_the_spend(tenant, django_capture_on_commit_callbacks):
    out = io.StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command("grant_credits", tenant.slug, "42.5", reason="top-up", stdout=out)
    assert credit_balance(tenant) == Decimal("42.5")
    assert "ledger balance 42.500000" in out.getvalue()
    out = io.StringIO()
    call_command("credit_spend", tenant.slug, "--json", stdout=out)
    report = json.loads(out.getvalue())
    assert report["ledger_balance"] == "42.500000"
    assert report["routers"]["available"] == "42.500000"
    assert report["today"]["requests"] == "0"
    out = io.StringIO()
    call_command("credit_spend", tenant.slug, stdout=out)
    assert "42.500000 available" in out.getvalue()


def test_commands_refuse_an_unknown_tenant_and_a_bad_amount(tenant):
    with pytest.raises(CommandError, match="no tenant"):
        call_command("credit_spend", "nobody")
    with pytest.raises(CommandError, match="amount"):
        call_command("grant_credits", tenant.slug, "lots", reason="x")
