"""Reads the REST API needs beyond `selectors.py`: roles, management tokens, audit queries."""

from __future__ import annotations

from datetime import datetime

from django.apps import apps as django_apps
from django.db.models import Q, QuerySet

from apps.common.models import AuditEvent
from apps.tenants.models import ApiKey, ManagementToken, Membership, Tenant


def membership_role(*, user_id: int, tenant: Tenant) -> str | None:
    """The user's role in the tenant, or None when not a member."""
    return (
        Membership.objects.filter(user_id=user_id, tenant=tenant)
        .values_list("role", flat=True)
        .first()
    )


def management_token_get_by_prefix(prefix: str) -> ManagementToken | None:
    return ManagementToken.objects.select_related("tenant").filter(prefix=prefix).first()


def management_tokens_for_tenant(tenant: Tenant) -> QuerySet[ManagementToken]:
    """A tenant's tokens, active and not, newest first."""
    return ManagementToken.objects.filter(tenant=tenant).order_by("-id")


def api_key_of_tenant(tenant: Tenant, prefix: str) -> ApiKey | None:
    """The tenant's key with this prefix; None for another tenant's key."""
    return ApiKey.objects.select_related("tenant").filter(tenant=tenant, prefix=prefix).first()


def audit_events_of_tenant(tenant: Tenant) -> QuerySet[AuditEvent]:
    """Audit events about the tenant and the objects it owns, newest first.

    What it owns is every model that declares ``AUDIT_TENANT_FIELD`` (the name of its tenant
    foreign key): keys, tokens, memberships here; credit accounts and budgets in billing, a
    layer above, which tenants therefore never imports.
    """
    targets = {"tenants.tenant": [str(tenant.pk)]}
    for model in django_apps.get_models():
        field = getattr(model, "AUDIT_TENANT_FIELD", None)
        if field:
            pks = model._default_manager.filter(**{field: tenant}).values_list("pk", flat=True)
            targets[model._meta.label_lower] = [str(pk) for pk in pks]
    condition = Q()
    for target_type, ids in targets.items():
        if ids:
            condition |= Q(target_type=target_type, target_id__in=ids)
    return AuditEvent.objects.filter(condition).order_by("-id")


def audit_events_filtered(
    events: QuerySet[AuditEvent] | None = None,
    *,
    action: str | None = None,
    target_type: str | None = None,
    target_id: str | None = None,
    actor: str | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> QuerySet[AuditEvent]:
    """Audit events (all, or within ``events``) narrowed by the given filters, newest first.

    ``action`` matches exactly or, ending in ``.``, as a prefix (``api_key.``).
    """
    result = events if events is not None else AuditEvent.objects.all()
    if action:
        result = (
            result.filter(action__startswith=action)
            if action.endswith(".")
            else result.filter(action=action)
        )
    if target_type:
        result = result.filter(target_type=target_type)
    if target_id:
        result = result.filter(target_id=target_id)
    if actor:
        result = result.filter(actor_label=actor)
    if since is not None:
        result = result.filter(created_at__gte=since)
    if until is not None:
        result = result.filter(created_at__lt=until)
    return result.order_by("-id")
