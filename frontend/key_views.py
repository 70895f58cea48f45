"""Create and revoke a tenant's API keys from its dashboard page.

Same services (``api_key_create`` / ``api_key_revoke``) and role rule as the REST API: a
tenant the user may not watch is 404, a viewer (or staff without a membership) gets 403. A new
key's secret is shown once, in the response to the POST, and is stored nowhere.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect
from django.views.decorators.http import require_POST

from apps.tenants.api_selectors import api_key_of_tenant
from apps.tenants.models import Tenant
from apps.tenants.selectors import tenant_get
from apps.tenants.services import api_key_create, api_key_revoke
from frontend.access import may_watch, visible_tenants
from frontend.tenant_panels import may_manage_keys
from frontend.views import tenant_page_render


def _managed_tenant(request: HttpRequest, slug: str) -> Tenant:
    tenant = tenant_get(slug)
    if tenant is None or not may_watch(visible_tenants(request.user), slug):
        raise Http404("no such tenant")
    if not may_manage_keys(request.user, tenant):
        raise PermissionDenied("Your role in this tenant does not allow managing API keys.")
    return tenant


@login_required
@require_POST
def key_create(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = _managed_tenant(request, slug)
    try:
        key, secret = api_key_create(
            actor=request.user,  # type: ignore[arg-type]
            tenant=tenant,
            name=request.POST.get("name", "").strip(),
        )
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
        return redirect("dashboard:tenant", slug=slug)
    messages.success(request, f"API key '{key.name}' ({key.prefix}) created.")
    return tenant_page_render(request, tenant, new_secret=secret)


@login_required
@require_POST
def key_revoke(request: HttpRequest, slug: str, prefix: str) -> HttpResponse:
    tenant = _managed_tenant(request, slug)
    key = api_key_of_tenant(tenant, prefix)
    if key is None:
        raise Http404("no such API key")
    try:
        api_key_revoke(actor=request.user, api_key=key)  # type: ignore[arg-type]
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        messages.success(request, f"API key '{key.name}' ({key.prefix}) revoked.")
    return redirect("dashboard:tenant", slug=slug)
