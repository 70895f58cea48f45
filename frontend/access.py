"""Who may see what on the dashboard, and the live documents cut down to it.

Staff see every tenant and the whole fleet. Anyone else sees the tenants they are a member
of (``apps.tenants`` Membership), and of each live document only those tenants' rows and
the request classes (the SLO lines); pools and endpoints are fleet-wide, so they are left out.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser, AnonymousUser

from apps.tenants.selectors import memberships_for_user

ALL = None  # visible_tenants() of staff: no restriction


def visible_tenants(user: AbstractBaseUser | AnonymousUser) -> frozenset[str] | None:
    """The tenant slugs ``user`` may watch; None = all of them (staff); empty = none."""
    if not user.is_authenticated or not user.is_active:
        return frozenset()
    if getattr(user, "is_staff", False):
        return ALL
    return frozenset(memberships_for_user(user.pk).values_list("tenant__slug", flat=True))


def may_watch(visible: frozenset[str] | None, tenant: str) -> bool:
    return visible is ALL or tenant in visible


def filter_document(
    document: dict[str, Any], visible: frozenset[str] | None, tenant: str = ""
) -> dict[str, Any]:
    """``document`` as a viewer with ``visible`` tenants, narrowed to ``tenant`` if given."""
    if visible is ALL and not tenant:
        return document
    rows = document.get("rows", [])
    keep = [
        row
        for row in rows
        if (not tenant or row.get("tenant") == tenant) and may_watch(visible, row.get("tenant", ""))
    ]
    narrowed = {**document, "rows": keep}
    if visible is not ALL:
        narrowed["pools"] = []
        narrowed["endpoints"] = []
    return narrowed
