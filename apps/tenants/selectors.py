"""Reads of the tenants app, for the admin, the API and the runtime snapshot."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.db import models
from django.db.models import Q, QuerySet
from django.utils import timezone

from apps.common.models import AuditEvent
from apps.tenants.models import ApiKey, Membership, RequestClass, Tenant


@dataclass(frozen=True, slots=True)
class TenantEntitlements:
    """What a tenant may use: its classes, default class, fair-share weight and limits."""

    classes: tuple[str, ...]
    default_class: str | None
    weight: float
    rpm_limit: int
    tpm_limit: int
    max_concurrency: int
    max_context_tokens: int
    max_output_tokens: int


def tenant_get(slug: str) -> Tenant | None:
    """The tenant with this slug, or None."""
    return (
        Tenant.objects.select_related("default_class")
        .prefetch_related("allowed_classes")
        .filter(slug=slug)
        .first()
    )


def tenant_list(*, status: str | None = None) -> QuerySet[Tenant]:
    """All tenants (optionally only those with `status`), classes loaded, ordered by slug."""
    tenants = Tenant.objects.select_related("default_class").prefetch_related("allowed_classes")
    if status is not None:
        tenants = tenants.filter(status=status)
    return tenants.order_by("slug")


def tenant_entitlements(tenant: Tenant) -> TenantEntitlements:
    """The tenant's entitlements; class names in priority order."""
    classes = tuple(c.name for c in sorted(tenant.allowed_classes.all(), key=_class_order))
    return TenantEntitlements(
        classes=classes,
        default_class=tenant.default_class.name if tenant.default_class is not None else None,
        weight=tenant.weight,
        rpm_limit=tenant.rpm_limit,
        tpm_limit=tenant.tpm_limit,
        max_concurrency=tenant.max_concurrency,
        max_context_tokens=tenant.max_context_tokens,
        max_output_tokens=tenant.max_output_tokens,
    )


def _class_order(request_class: RequestClass) -> tuple[int, str]:
    return request_class.priority_band, request_class.name


def request_class_list() -> QuerySet[RequestClass]:
    """All request classes, most urgent band first."""
    return RequestClass.objects.order_by("priority_band", "name")


def api_keys_active(*, now: datetime | None = None) -> QuerySet[ApiKey]:
    """Keys that are neither revoked nor expired (at `now`, default the current time)."""
    moment = now if now is not None else timezone.now()
    return (
        ApiKey.objects.select_related("tenant")
        .filter(revoked_at__isnull=True)
        .filter(Q(expires_at__isnull=True) | Q(expires_at__gt=moment))
        .order_by("prefix")
    )


def api_key_get_by_prefix(prefix: str) -> ApiKey | None:
    """The key with this public prefix, or None."""
    return ApiKey.objects.select_related("tenant").filter(prefix=prefix).first()


def api_keys_for_tenant(tenant: Tenant) -> QuerySet[ApiKey]:
    """A tenant's keys, active and not, newest first."""
    return ApiKey.objects.filter(tenant=tenant).order_by("-created_at", "-id")


def memberships_for_user(user_id: int) -> QuerySet[Membership]:
    """A user's memberships, tenants loaded."""
    return (
        Membership.objects.select_related("tenant").filter(user_id=user_id).order_by("tenant__slug")
    )


def membership_list(tenant: Tenant) -> QuerySet[Membership]:
    """A tenant's members, users loaded."""
    return Membership.objects.select_related("user").filter(tenant=tenant).order_by("created_at")


def audit_events_for(target: models.Model) -> QuerySet[AuditEvent]:
    """The audit trail of one object, newest first."""
    return AuditEvent.objects.filter(
        target_type=target._meta.label_lower, target_id=str(target.pk)
    ).order_by("-created_at", "-id")
