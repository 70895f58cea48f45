"""Credit accounts, price sheets, the usage ledger and budgets."""

from __future__ import annotations

from decimal import Decimal
from typing import Any, ClassVar

from django.db import models

from apps.common.retention_policy import Retention
from apps.models.models import Endpoint, ModelVersion
from apps.tenants.models import ApiKey, Tenant

CREDITS = {"max_digits": 20, "decimal_places": 6}


class CreditAccount(models.Model):
    class Overdraft(models.TextChoices):
        REFUSE = "refuse", "Refuse (402)"
        BATCH = "batch", "Drop to the lowest band (best effort)"

    AUDIT_TENANT_FIELD: ClassVar[str] = "tenant"  # its audit events show in the tenant's log
    tenant = models.OneToOneField(Tenant, on_delete=models.CASCADE, related_name="credit_account")
    balance = models.DecimalField(**CREDITS, default=Decimal(0))  # type: ignore[arg-type]
    overdraft = models.CharField(
        max_length=8,
        choices=Overdraft.choices,
        default=Overdraft.REFUSE,
        help_text="What happens to a request the balance does not cover.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.tenant.slug}: {self.balance}"


class Price(models.Model):
    """Credits per 1k tokens for one version on one hardware tier."""

    version = models.ForeignKey(ModelVersion, on_delete=models.CASCADE, related_name="prices")
    hardware_tier = models.CharField(max_length=32)
    input_per_1k = models.DecimalField(**CREDITS)  # type: ignore[arg-type]
    output_per_1k = models.DecimalField(**CREDITS)  # type: ignore[arg-type]
    cache_hit_discount = models.DecimalField(
        max_digits=4, decimal_places=3, default=Decimal("0.5"), help_text="Fraction off, 0..1."
    )
    batch_discount = models.DecimalField(
        max_digits=4,
        decimal_places=3,
        default=Decimal(0),
        help_text="Fraction off for Batch API lines, 0..1.",
    )
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar[list[Any]] = [
            models.UniqueConstraint(fields=["version", "hardware_tier"], name="price_unique_tier"),
            models.CheckConstraint(
                condition=models.Q(input_per_1k__gte=0)
                & models.Q(output_per_1k__gte=0)
                & models.Q(cache_hit_discount__gte=0)
                & models.Q(cache_hit_discount__lte=1)
                & models.Q(batch_discount__gte=0)
                & models.Q(batch_discount__lte=1),
                name="price_values_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.version} on {self.hardware_tier}"


class UsageRecord(models.Model):
    """One metered request. ``event_id`` is unique, so replays of the usage stream are no-ops."""

    class Outcome(models.TextChoices):
        OK = "ok", "OK"
        ERROR = "error", "Error"
        CANCELLED = "cancelled", "Cancelled"
        REJECTED = "rejected", "Rejected"

    event_id = models.CharField(max_length=64, unique=True)
    tenant = models.ForeignKey(Tenant, on_delete=models.PROTECT, related_name="usage")
    api_key = models.ForeignKey(
        ApiKey, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    version = models.ForeignKey(
        ModelVersion, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    endpoint = models.ForeignKey(
        Endpoint, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    request_class = models.CharField(max_length=40)
    tokens_in = models.PositiveIntegerField(default=0)
    tokens_out = models.PositiveIntegerField(default=0)
    credits = models.DecimalField(**CREDITS, default=Decimal(0))  # type: ignore[arg-type]
    cached = models.BooleanField(default=False)
    queue_ms = models.FloatField(null=True, blank=True)
    ttft_ms = models.FloatField(null=True, blank=True)
    total_ms = models.FloatField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=Outcome.choices)
    occurred_at = models.DateTimeField(db_index=True)
    recorded_at = models.DateTimeField(auto_now_add=True)
    # Budgets add up the current day's / month's usage: at least a month is kept.
    retention: ClassVar[Retention] = Retention("usage", "occurred_at", min_days=32)

    class Meta:
        ordering: ClassVar[list[str]] = ["-occurred_at"]
        indexes: ClassVar[list[Any]] = [models.Index(fields=["tenant", "occurred_at"])]

    def __str__(self) -> str:
        return self.event_id


class Budget(models.Model):
    class Period(models.TextChoices):
        DAY = "day", "Day"
        MONTH = "month", "Month"

    AUDIT_TENANT_FIELD: ClassVar[str] = "tenant"  # its audit events show in the tenant's log
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="budgets")
    period = models.CharField(max_length=8, choices=Period.choices)
    soft_alert_pct = models.PositiveSmallIntegerField(default=80)
    hard_cap = models.DecimalField(**CREDITS)  # type: ignore[arg-type]
    webhook_url = models.URLField(blank=True, default="", help_text="POSTed on a soft alert.")
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints: ClassVar[list[Any]] = [
            models.UniqueConstraint(fields=["tenant", "period"], name="budget_unique_period"),
            models.CheckConstraint(
                condition=models.Q(soft_alert_pct__gte=1)
                & models.Q(soft_alert_pct__lte=100)
                & models.Q(hard_cap__gt=0),
                name="budget_values_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tenant.slug}/{self.period}"


class BudgetAlert(models.Model):
    """A budget's soft alert fired: once per budget and period (day or month) start."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    period_start = models.DateField()
    spent = models.DecimalField(**CREDITS)  # type: ignore[arg-type]
    threshold = models.DecimalField(**CREDITS)  # type: ignore[arg-type]
    created_at = models.DateTimeField(auto_now_add=True)
    # One alert per budget period: kept at least a month, or a deleted one would fire again.
    retention: ClassVar[Retention] = Retention("budget_alerts", "created_at", min_days=32)
    webhook_status = models.CharField(max_length=64, blank=True, default="")

    class Meta:
        ordering: ClassVar[list[str]] = ["-created_at"]
        constraints: ClassVar[list[Any]] = [
            models.UniqueConstraint(fields=["budget", "period_start"], name="alert_once_per_period")
        ]

    def __str__(self) -> str:
        return f"{self.budget} from {self.period_start}: {self.spent} of {self.budget.hard_cap}"
