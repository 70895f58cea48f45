"""Tenants, their request classes and limits, API keys, memberships and the audit log."""

from __future__ import annotations

from typing import Any, ClassVar

from django.conf import settings
from django.core.validators import MaxValueValidator, MinValueValidator
from django.db import models

MAX_HEARTBEAT_MS = 5000  # issue #33: a queued stream hears from the router every 5 s at most


class RequestClass(models.Model):
    """A service class such as interactive / standard / batch."""

    name = models.SlugField(max_length=40, unique=True)
    priority_band = models.PositiveSmallIntegerField(help_text="0 is the most urgent band.")
    ttft_slo_ms = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    deadline_ms = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_queue_length = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    shed_order = models.PositiveSmallIntegerField(
        help_text="Under overload, classes with a lower shed order are shed first."
    )
    heartbeat_ms = models.PositiveIntegerField(
        default=5000,
        validators=[MaxValueValidator(MAX_HEARTBEAT_MS)],
        help_text="A queued stream gets a ': queued' SSE comment this often (ms; 0 = off).",
    )
    itl_slo_ms = models.PositiveIntegerField(
        default=200,
        validators=[MinValueValidator(1)],
        help_text="Objective for a stream's p95 inter-token latency (ms).",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["priority_band", "name"]
        constraints: ClassVar[list[Any]] = [
            models.CheckConstraint(
                condition=models.Q(ttft_slo_ms__gt=0)
                & models.Q(deadline_ms__gt=0)
                & models.Q(max_queue_length__gt=0),
                name="requestclass_positive_slos",
            ),
            models.CheckConstraint(
                condition=models.Q(deadline_ms__gte=models.F("ttft_slo_ms")),
                name="requestclass_deadline_after_ttft",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class Tenant(models.Model):
    class Status(models.TextChoices):
        ACTIVE = "active", "Active"
        SUSPENDED = "suspended", "Suspended"

    slug = models.SlugField(max_length=63, unique=True)
    name = models.CharField(max_length=200)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.ACTIVE)
    weight = models.FloatField(default=1.0, help_text="Fair-share weight; must be > 0.")
    rpm_limit = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    tpm_limit = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_concurrency = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_context_tokens = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_output_tokens = models.PositiveIntegerField(validators=[MinValueValidator(1)])
    max_request_bytes = models.PositiveIntegerField(
        default=0, help_text="Largest request body in bytes; 0 = only the router's own cap."
    )
    result_cache = models.BooleanField(
        default=True, help_text="Serve this tenant's deterministic requests from the cache."
    )
    zero_retention = models.BooleanField(
        default=False,
        help_text="Keep nothing of this tenant's requests: never cached, no idempotency "
        "record, only usage metadata.",
    )
    batch_file_retention_days = models.PositiveIntegerField(
        null=True,
        blank=True,
        validators=[MinValueValidator(1)],
        help_text="Days a Batch API file (input, output, error) is kept after its upload or "
        "creation; empty = kept until deleted. Zero retention still wins.",
    )
    allowed_classes = models.ManyToManyField(RequestClass, related_name="tenants", blank=True)
    allowed_models = models.ManyToManyField(
        "registry.Model",
        related_name="tenants",
        blank=True,
        help_text="Models the tenant may use; none selected means every model.",
    )
    default_class = models.ForeignKey(
        RequestClass, on_delete=models.PROTECT, related_name="default_for", null=True, blank=True
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["slug"]
        constraints: ClassVar[list[Any]] = [
            models.CheckConstraint(condition=models.Q(weight__gt=0), name="tenant_weight_positive"),
            models.CheckConstraint(
                condition=models.Q(rpm_limit__gt=0)
                & models.Q(tpm_limit__gt=0)
                & models.Q(max_concurrency__gt=0)
                & models.Q(max_context_tokens__gt=0)
                & models.Q(max_output_tokens__gt=0),
                name="tenant_limits_positive",
            ),
        ]

    def __str__(self) -> str:
        return self.slug


class ApiKey(models.Model):
    """An API key. Only the public prefix and a sha256 digest of the whole key are stored."""

    AUDIT_TENANT_FIELD: ClassVar[str] = "tenant"  # its audit events show in the tenant's log
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64, unique=True)
    scopes = models.JSONField(default=list)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["tenant_id", "name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"


class Membership(models.Model):
    class Role(models.TextChoices):
        OWNER = "owner", "Owner"
        ADMIN = "admin", "Admin"
        VIEWER = "viewer", "Viewer"

    AUDIT_TENANT_FIELD: ClassVar[str] = "tenant"  # its audit events show in the tenant's log
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints: ClassVar[list[Any]] = [
            models.UniqueConstraint(fields=["user", "tenant"], name="membership_unique_user_tenant")
        ]

    def __str__(self) -> str:
        return f"{self.user} @ {self.tenant} ({self.role})"


class ManagementToken(models.Model):
    """A tenant's token for the REST API (never for inference): one tenant, one role.

    Separate from `ApiKey`, so an inference key can never manage a tenant and a management
    token never reaches the router. Only the public prefix and a sha256 digest are stored.
    """

    AUDIT_TENANT_FIELD: ClassVar[str] = "tenant"  # its audit events show in the tenant's log
    tenant = models.ForeignKey(Tenant, on_delete=models.CASCADE, related_name="management_tokens")
    name = models.CharField(max_length=100)
    role = models.CharField(max_length=16, choices=Membership.Role.choices)
    prefix = models.CharField(max_length=16, unique=True)
    digest = models.CharField(max_length=64, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering: ClassVar[list[str]] = ["tenant_id", "-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.role})"
