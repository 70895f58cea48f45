"""The dashboard's pages. Live numbers arrive over the websocket; pages render what is stored.

Operator pages (fleet, traffic, stages, tenants, rollouts, scaling) are for staff; a tenant page
is for staff and the tenant's members. Nothing here polls: the browser keeps the live series,
and the staff feed (frontend/control_feed.py) updates the rollouts and scaling pages.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required, user_passes_test
from django.core.exceptions import ValidationError
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from apps.batches.selectors import batches_listed
from apps.rollouts.models import Rollout
from apps.safety.selectors import interventions_of_tenant
from apps.tenants.models import Tenant
from apps.tenants.selectors import (
    api_keys_for_tenant,
    memberships_for_user,
    request_class_list,
    tenant_get,
)
from frontend.access import may_watch, visible_tenants
from frontend.rollout_actions import action_perform, action_queue, rollout_actions
from frontend.rollout_panels import rollout_view, rollouts_recent
from frontend.scaling_panels import scaling_view
from frontend.tenant_panels import balance, batch_rows, budget_rows, may_manage_keys

INTERVENTIONS_SHOWN = 20  # the tenant page's safety table: the newest ones
BATCHES_SHOWN = 20  # the tenant page's batches: the newest ones (all of them: the REST list)

OPERATOR_PAGES = ("fleet", "traffic", "stages", "tenants")

staff_required = user_passes_test(lambda user: user.is_active and user.is_staff)


@login_required
def home(request: HttpRequest) -> HttpResponse:
    if request.user.is_staff:
        return redirect("dashboard:page", page="traffic")
    membership = memberships_for_user(request.user.pk or 0).first()
    if membership is None:
        return render(request, "frontend/no_tenant.html", status=403)
    return redirect("dashboard:tenant", slug=membership.tenant.slug)


@staff_required
def operator_page(request: HttpRequest, page: str) -> HttpResponse:
    if page not in OPERATOR_PAGES:
        raise Http404("no such dashboard page")
    context: dict[str, Any] = {"page": page, "ws_tenant": ""}
    return render(request, f"frontend/{page}.html", context)


@login_required
def tenant_page(request: HttpRequest, slug: str) -> HttpResponse:
    tenant = tenant_get(slug)
    if tenant is None or not may_watch(visible_tenants(request.user), slug):
        raise Http404("no such tenant")
    return tenant_page_render(request, tenant)


def tenant_page_render(request: HttpRequest, tenant: Tenant, new_secret: str = "") -> HttpResponse:
    """The tenant page; ``new_secret`` is a just-created key's secret, shown this once."""
    context = {
        "page": "tenant",
        "tenant": tenant,
        "ws_tenant": tenant.slug,
        "keys": api_keys_for_tenant(tenant),
        "classes": request_class_list().filter(tenants=tenant),
        "may_manage_keys": may_manage_keys(request.user, tenant),
        "new_secret": new_secret,
        "balance": balance(tenant),
        "budgets": budget_rows(tenant),
        "interventions": interventions_of_tenant(tenant)[:INTERVENTIONS_SHOWN],
        "batches": batch_rows(batches_listed(tenant=tenant)[:BATCHES_SHOWN]),
    }
    return render(request, "frontend/tenant.html", context)


@staff_required
def rollouts_page(request: HttpRequest) -> HttpResponse:
    actions = list(rollout_actions().values())
    rollouts = [
        {
            "view": view,
            "buttons": [(action, action.enabled_in(view["state"])) for action in actions],
        }
        for view in (rollout_view(r) for r in rollouts_recent())
    ]
    context = {
        "page": "rollouts",
        "rollouts": rollouts,
        "ws_tenant": "",
        "actions_states": {a.name: list(a.states) for a in actions},
    }
    return render(request, "frontend/rollouts.html", context)


@staff_required
@require_POST
def rollout_action(request: HttpRequest, pk: int, action: str) -> HttpResponse:
    chosen = rollout_actions().get(action)
    if chosen is None:
        raise Http404("no such rollout action")
    rollout = get_object_or_404(Rollout, pk=pk)
    reason = request.POST.get("reason", "").strip() or f"{chosen.label} from the dashboard"
    if chosen.task is not None:
        outcome = action_queue(chosen, actor=request.user, rollout=rollout, reason=reason)  # type: ignore[arg-type]
        getattr(messages, outcome.level)(request, outcome.text)
        return redirect("dashboard:rollouts")
    try:
        action_perform(chosen, actor=request.user, rollout=rollout, reason=reason)  # type: ignore[arg-type]
    except ValidationError as exc:
        messages.error(request, "; ".join(exc.messages))
    else:
        messages.success(request, f"Rollout #{pk}: {chosen.label.lower()} done.")
    return redirect("dashboard:rollouts")


@staff_required
def scaling_page(request: HttpRequest) -> HttpResponse:
    context = {"page": "scaling", "pools": scaling_view(), "ws_tenant": ""}
    return render(request, "frontend/scaling.html", context)


def plotly_js(request: HttpRequest) -> FileResponse:
    """plotly.js from the installed ``plotly`` package (no CDN), cached by the browser."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or spec.origin is None:
        raise Http404("the plotly package is not installed")
    path = Path(spec.origin).parent / "package_data" / "plotly.min.js"
    response = FileResponse(path.open("rb"), content_type="text/javascript")
    response["Cache-Control"] = "public, max-age=86400"
    return response
