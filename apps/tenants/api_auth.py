"""Who is calling the REST API, and what they may do.

Two credentials: a Django session (a tenant member through `Membership`, or a staff operator)
and a tenant's management token (``Authorization: Bearer sym_...``). Tenant endpoints live
under ``/api/v1/tenants/<slug>/``; a caller who is not a member of that tenant (or whose token
belongs to another tenant) gets 404, never the tenant's data. Roles rank viewer < admin <
owner; every view names the role its reads and writes need. Operator endpoints need a staff
session; tokens never reach them.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

from django.contrib.auth.base_user import AbstractBaseUser
from django.contrib.auth.models import AnonymousUser
from django.http import Http404
from django.utils import timezone
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from apps.tenants.api_selectors import management_token_get_by_prefix, membership_role
from apps.tenants.models import ManagementToken, Membership, Tenant
from apps.tenants.selectors import tenant_get
from apps.tenants.services.management_tokens import (
    management_token_digest,
    management_token_split,
    management_token_touch,
)

if TYPE_CHECKING:
    from rest_framework.views import APIView

ROLE_RANK = {Membership.Role.VIEWER: 0, Membership.Role.ADMIN: 1, Membership.Role.OWNER: 2}
READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


class TokenActor(AnonymousUser):
    """The request user of a management-token call: authenticated, no database user.

    Services record it in the audit log as ``token:<prefix>`` (no actor row).
    """

    def __init__(self, token: ManagementToken) -> None:
        super().__init__()
        self.token = token

    @property
    def is_authenticated(self) -> bool:  # type: ignore[override]
        return True

    @property
    def is_anonymous(self) -> bool:  # type: ignore[override]
        return False

    def get_username(self) -> str:
        return f"token:{self.token.prefix}"


def actor_of(request: Request) -> AbstractBaseUser:
    """The actor the services record: the session user, or the token as a pseudo-user."""
    return cast(AbstractBaseUser, request.user)


class ManagementTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer sym_<prefix>_<secret>``; inference keys are not accepted."""

    keyword = "bearer"

    def authenticate(self, request: Request) -> tuple[TokenActor, ManagementToken] | None:
        header = authentication.get_authorization_header(request).decode("latin-1")
        scheme, _, raw = header.strip().partition(" ")
        if scheme.lower() != self.keyword:
            return None
        presented = raw.strip()
        prefix = management_token_split(presented)
        token = management_token_get_by_prefix(prefix) if prefix else None
        if token is None or not hmac.compare_digest(
            token.digest, management_token_digest(presented)
        ):
            raise exceptions.AuthenticationFailed("Invalid management token.")
        now = timezone.now()
        if token.revoked_at is not None:
            raise exceptions.AuthenticationFailed("This management token was revoked.")
        if token.expires_at is not None and token.expires_at <= now:
            raise exceptions.AuthenticationFailed("This management token has expired.")
        management_token_touch(token=token, used_at=now)
        return TokenActor(token), token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="switchyard"'


@dataclass(frozen=True, slots=True)
class TenantAccess:
    tenant: Tenant
    role: str

    def at_least(self, role: str) -> bool:
        return ROLE_RANK[Membership.Role(self.role)] >= ROLE_RANK[Membership.Role(role)]


def tenant_access(request: Request, slug: str) -> TenantAccess:
    """The tenant at ``slug`` and the caller's role in it; 404 when the caller is not in it."""
    token = request.auth if isinstance(request.auth, ManagementToken) else None
    if token is not None:
        if token.tenant.slug != slug:
            raise Http404
        return TenantAccess(token.tenant, token.role)
    tenant = tenant_get(slug)
    user = request.user
    role = membership_role(user_id=user.pk, tenant=tenant) if tenant and user.pk else None
    if tenant is None or role is None:
        raise Http404
    return TenantAccess(tenant, role)


class TenantRolePermission(permissions.BasePermission):
    """Reads need ``view.read_role`` (default viewer), writes ``view.write_role`` (admin).

    Resolves the tenant once and leaves it on ``request.tenant_access``.
    """

    message = "Your role in this tenant does not allow this."

    def has_permission(self, request: Request, view: APIView) -> bool:
        if not request.user or not request.user.is_authenticated:
            return False
        access = tenant_access(request, str(view.kwargs.get("tenant", "")))
        request.tenant_access = access  # type: ignore[attr-defined]
        needed = (
            getattr(view, "read_role", Membership.Role.VIEWER)
            if request.method in READ_METHODS
            else getattr(view, "write_role", Membership.Role.ADMIN)
        )
        return access.at_least(needed)


class IsOperator(permissions.BasePermission):
    """Staff users with a session; management tokens never pass."""

    message = "Operator endpoints need a staff account."

    def has_permission(self, request: Request, view: APIView) -> bool:
        user = request.user
        return bool(
            user
            and user.is_authenticated
            and not isinstance(request.auth, ManagementToken)
            and user.is_staff
        )


def access_of(request: Request) -> TenantAccess:
    access: TenantAccess = request.tenant_access  # type: ignore[attr-defined]
    return access
