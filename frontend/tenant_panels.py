"""What the tenant page shows beyond the live charts: who may manage keys, the balance and
budgets (read through the billing selectors, the same ones the REST ``BalanceApi`` uses), and
the Batch API's batches with their progress (the selector of the REST batch lists)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser

from apps.batches.models import Batch
from apps.batches.selectors import batch_progress
from apps.billing.selectors import budgets_for, credit_balance, period_starts, usage_totals
from apps.tenants.api_auth import ROLE_RANK
from apps.tenants.api_selectors import membership_role
from apps.tenants.models import Membership, Tenant


@dataclass(frozen=True, slots=True)
class BudgetRow:
    period: str
    spent: Decimal
    hard_cap: Decimal
    soft_alert_pct: int
    soft_alert_at: Decimal

    @property
    def state(self) -> str:
        if self.spent >= self.hard_cap:
            return "over hard cap"
        if self.spent >= self.soft_alert_at:
            return "over soft alert"
        return "ok"


def may_manage_keys(user: AbstractBaseUser | AnonymousUser, tenant: Tenant) -> bool:
    """The REST API's rule: admins and owners of the tenant manage its keys (viewers read)."""
    if not user.is_authenticated or not user.pk:
        return False
    role = membership_role(user_id=int(user.pk), tenant=tenant)
    admin = ROLE_RANK[Membership.Role.ADMIN]
    return role is not None and ROLE_RANK[Membership.Role(role)] >= admin


def budget_rows(tenant: Tenant) -> list[BudgetRow]:
    """Each budget with this period's (UTC day or month) spend."""
    starts = dict(zip(("day", "month"), period_starts(), strict=True))
    rows = []
    for budget in budgets_for(tenant):
        spent = usage_totals(tenant, starts[budget.period])["credits"]
        rows.append(
            BudgetRow(
                period=budget.period,
                spent=spent,
                hard_cap=budget.hard_cap,
                soft_alert_pct=budget.soft_alert_pct,
                soft_alert_at=budget.hard_cap * budget.soft_alert_pct / 100,
            )
        )
    return rows


def balance(tenant: Tenant) -> Decimal:
    return credit_balance(tenant)


@dataclass(frozen=True, slots=True)
class BatchRow:
    id: str
    endpoint: str
    status: str
    total: int
    completed: int
    failed: int
    percent: int  # finished lines (answered or failed), 0..100
    paused_reason: str
    created_at: datetime
    expires_at: datetime


def batch_rows(batches: Iterable[Batch]) -> list[BatchRow]:
    """The batches as the tenant page's table shows them."""
    return [_batch_row(b) for b in batches]


def _batch_row(b: Batch) -> BatchRow:
    return BatchRow(
        id=b.public_id, endpoint=b.endpoint, status=b.status, total=b.total,
        completed=b.completed, failed=b.failed, percent=int(batch_progress(b) * 100),
        paused_reason=b.paused_reason, created_at=b.created_at, expires_at=b.expires_at,
    )  # fmt: skip
