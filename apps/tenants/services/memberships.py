"""Memberships: which users belong to which tenant, with which role."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from django.contrib.auth.base_user import AbstractBaseUser
from django.core.exceptions import ValidationError
from django.db import transaction

from apps.common.audit import audit_record
from apps.common.changes import audited_update
from apps.tenants.models import Membership, Tenant


def membership_validate_values(values: Mapping[str, Any]) -> None:
    """Check the role where present; raise a per-field ValidationError."""
    if "role" in values and values["role"] not in Membership.Role.values:
        raise ValidationError(
            {"role": f"Role must be one of: {', '.join(Membership.Role.values)}."}
        )


def _state(membership: Membership) -> dict[str, Any]:
    return {
        "user": membership.user.get_username(),
        "tenant": membership.tenant.slug,
        "role": membership.role,
    }


def membership_create(
    *, actor: AbstractBaseUser | None, user: AbstractBaseUser, tenant: Tenant, role: str
) -> Membership:
    """Add a user to a tenant; a user has at most one membership per tenant."""
    membership_validate_values({"role": role})
    if Membership.objects.filter(user_id=user.pk, tenant=tenant).exists():
        raise ValidationError(
            {"user": f"'{user.get_username()}' is already a member of '{tenant.slug}'."}
        )
    with transaction.atomic():
        membership = Membership.objects.create(user_id=user.pk, tenant=tenant, role=role)
        audit_record(
            actor=actor, action="membership.create", target=membership, after=_state(membership)
        )
    return membership


def membership_update_role(
    *, actor: AbstractBaseUser | None, membership: Membership, role: str
) -> Membership:
    """Change a member's role; setting the role it already has writes nothing."""
    membership_validate_values({"role": role})
    if membership.role == role:
        return membership
    with transaction.atomic():
        audited_update(
            actor=actor,
            action="membership.update_role",
            target=membership,
            changes={"role": role},
            publish=False,
        )
    return membership


def membership_delete(*, actor: AbstractBaseUser | None, membership: Membership) -> None:
    """Remove a user from a tenant."""
    with transaction.atomic():
        audit_record(
            actor=actor, action="membership.delete", target=membership, before=_state(membership)
        )
        membership.delete()
