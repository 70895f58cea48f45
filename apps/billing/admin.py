"""Admin for billing. Prices, credit grants and budgets are written through
apps.billing.services (forms run the services' validators, so bad values are form errors);
credit balances change only by a grant with a reason; the usage ledger is read-only.
"""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.http import HttpRequest

from apps.billing.models import Budget, BudgetAlert, CreditAccount, Price, UsageRecord
from apps.billing.services import (
    budget_set,
    budget_validate,
    credit_grant,
    credit_grant_validate,
    credit_overdraft_set,
    price_set,
    price_validate,
)
from apps.common.admin_support import (
    ModelAdminBase,
    ModelFormBase,
    actor_of,
    adopt,
    run_validator,
)

PRICE_VALUES = ("input_per_1k", "output_per_1k", "cache_hit_discount", "batch_discount")
PRICE_FIELDS = ("version", "hardware_tier", *PRICE_VALUES)
BUDGET_FIELDS = ("tenant", "period", "soft_alert_pct", "hard_cap", "webhook_url")


class PriceForm(ModelFormBase[Price]):
    class Meta:
        model = Price
        fields = PRICE_FIELDS

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not self.errors:
            tier = cleaned.get("hardware_tier", self.instance.hardware_tier)
            values = {field: cleaned[field] for field in PRICE_VALUES}
            run_validator(self, lambda: price_validate(hardware_tier=tier, **values))
        return cleaned


@admin.register(Price)
class PriceAdmin(ModelAdminBase[Price]):
    form = PriceForm
    list_display = ("version", "hardware_tier", *PRICE_VALUES, "updated_at")
    list_filter = ("hardware_tier",)

    def get_readonly_fields(self, request: HttpRequest, obj: Price | None = None) -> Any:
        return () if obj is None else ("version", "hardware_tier")  # the price's identity

    def has_delete_permission(self, request: HttpRequest, obj: Price | None = None) -> bool:
        return False  # the data plane needs a price for every routable version

    def save_model(self, request: HttpRequest, obj: Price, form: Any, change: bool) -> None:
        data = form.cleaned_data
        version = obj.version if change else data["version"]
        tier = obj.hardware_tier if change else data["hardware_tier"]
        price = price_set(
            actor=actor_of(request),
            version=version,
            hardware_tier=tier,
            **{field: data[field] for field in PRICE_VALUES},
        )
        adopt(obj, price)


class CreditGrantForm(ModelFormBase[CreditAccount]):
    """A grant (or, with a negative amount, a correction) instead of editing the balance; and
    the overdraft setting."""

    amount = forms.DecimalField(
        max_digits=20, decimal_places=6, required=False, help_text="Negative to correct."
    )
    reason = forms.CharField(max_length=500, required=False)
    overdraft = forms.ChoiceField(
        choices=CreditAccount.Overdraft.choices,
        required=False,
        help_text="When the balance does not cover a request: refuse it (402), or serve it in "
        "the lowest band as best effort.",
    )

    class Meta:
        model = CreditAccount
        fields = ("tenant",)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.instance.pk is not None:
            self.fields["overdraft"].initial = self.instance.overdraft

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not self.errors:
            tenant = cleaned.get("tenant") or self.instance.tenant
            amount, reason = cleaned.get("amount"), cleaned.get("reason") or ""
            overdraft = cleaned.get("overdraft") or ""
            if amount is None and (not overdraft or overdraft == self.instance.overdraft):
                self.add_error("amount", "Give an amount to grant (or change the overdraft).")
            elif amount is not None:
                run_validator(
                    self,
                    lambda: credit_grant_validate(tenant=tenant, amount=amount, reason=reason),
                )
        return cleaned


@admin.register(CreditAccount)
class CreditAccountAdmin(ModelAdminBase[CreditAccount]):
    form = CreditGrantForm
    list_display = ("tenant", "balance", "overdraft", "updated_at")
    search_fields = ("tenant__slug",)

    def get_fields(self, request: HttpRequest, obj: CreditAccount | None = None) -> Any:
        base = ("tenant",) if obj is None else ("tenant", "balance", "updated_at")
        return (*base, "amount", "reason", "overdraft")

    def get_readonly_fields(self, request: HttpRequest, obj: CreditAccount | None = None) -> Any:
        return () if obj is None else ("tenant", "balance", "updated_at")

    def has_delete_permission(self, request: HttpRequest, obj: CreditAccount | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: CreditAccount, form: Any, change: bool) -> None:
        data = form.cleaned_data
        tenant = obj.tenant if change else data["tenant"]
        account = None
        if data.get("amount") is not None:
            account = credit_grant(
                actor=actor_of(request), tenant=tenant, amount=data["amount"], reason=data["reason"]
            )
        # (the form already copied the new value onto ``obj``: compare with the stored one)
        stored = CreditAccount.objects.filter(tenant=tenant).values_list("overdraft", flat=True)
        current = stored.first() or CreditAccount.Overdraft.REFUSE
        if data.get("overdraft") and data["overdraft"] != current:
            account = credit_overdraft_set(
                actor=actor_of(request), tenant=tenant, overdraft=data["overdraft"]
            )
        if account is not None:
            adopt(obj, account)


class BudgetForm(ModelFormBase[Budget]):
    webhook_url = forms.URLField(
        required=False, assume_scheme="https", help_text="POSTed (JSON) on a soft alert."
    )

    class Meta:
        model = Budget
        fields = BUDGET_FIELDS

    def clean(self) -> dict[str, Any]:
        cleaned = super().clean() or {}
        if not self.errors:
            period = cleaned.get("period", self.instance.period)
            pct, cap = cleaned["soft_alert_pct"], cleaned["hard_cap"]
            run_validator(
                self, lambda: budget_validate(period=period, soft_alert_pct=pct, hard_cap=cap)
            )
        return cleaned


@admin.register(Budget)
class BudgetAdmin(ModelAdminBase[Budget]):
    form = BudgetForm
    list_display = ("tenant", "period", "soft_alert_pct", "hard_cap", "updated_at")
    list_filter = ("period",)

    def get_readonly_fields(self, request: HttpRequest, obj: Budget | None = None) -> Any:
        return () if obj is None else ("tenant", "period")

    def has_delete_permission(self, request: HttpRequest, obj: Budget | None = None) -> bool:
        return False

    def save_model(self, request: HttpRequest, obj: Budget, form: Any, change: bool) -> None:
        data = form.cleaned_data
        budget = budget_set(
            actor=actor_of(request),
            tenant=obj.tenant if change else data["tenant"],
            period=obj.period if change else data["period"],
            soft_alert_pct=data["soft_alert_pct"],
            hard_cap=data["hard_cap"],
            webhook_url=data.get("webhook_url") or "",
        )
        adopt(obj, budget)


@admin.register(BudgetAlert)
class BudgetAlertAdmin(ModelAdminBase[BudgetAlert]):
    """Soft budget alerts as they fired (read-only)."""

    list_display = ("budget", "period_start", "spent", "threshold", "webhook_status", "created_at")
    list_filter = ("budget__period",)
    search_fields = ("budget__tenant__slug",)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: BudgetAlert | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: BudgetAlert | None = None) -> bool:
        return False


@admin.register(UsageRecord)
class UsageRecordAdmin(ModelAdminBase[UsageRecord]):
    """Read-only: the ledger is written once per usage event by the usage consumer."""

    list_display = (
        "occurred_at",
        "tenant",
        "version",
        "request_class",
        "tokens_in",
        "tokens_out",
        "credits",
        "cached",
        "outcome",
    )
    list_filter = ("outcome", "cached", "request_class")
    search_fields = ("event_id", "tenant__slug")
    date_hierarchy = "occurred_at"

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: UsageRecord | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: UsageRecord | None = None) -> bool:
        return False
