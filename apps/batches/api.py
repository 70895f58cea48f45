"""The Batch API's HTTP views on the control plane, in OpenAI's shapes.

Only the router calls these: it forwards ``/v1/files*`` and ``/v1/batches*`` with the
principal it resolved from the API key, signed (:mod:`runtime.internal_principal`). A request
without a valid signature is refused 401 whatever else it carries. Every object is the
signed tenant's: another tenant's id is a 404.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from apps.batches import services
from apps.batches.errors import BatchApiError, not_found
from apps.batches.models import Batch, File
from apps.batches.serialize import batch_object, file_object
from apps.tenants.models import Tenant
from runtime.internal_principal import HEADER, PrincipalRefusedError, verify

View = Callable[..., HttpResponse]
MAX_LIST_LIMIT = 100


def _error(exc: BatchApiError) -> HttpResponse:
    return HttpResponse(exc.body(), status=exc.status, content_type="application/json")


def batch_api(*methods: str) -> Callable[[Callable[..., HttpResponse]], View]:
    """The view answers ``methods`` for the signed tenant (its first argument after the
    request); refusals in OpenAI's error shape."""

    def decorate(view: Callable[..., HttpResponse]) -> View:
        @csrf_exempt
        @wraps(view)
        def wrapper(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                tenant = _signed_tenant(request, methods)
                return view(request, tenant, *args, **kwargs)
            except BatchApiError as exc:
                return _error(exc)

        return wrapper

    return decorate


def _signed_tenant(request: HttpRequest, methods: tuple[str, ...]) -> Tenant:
    if request.method not in methods:
        raise BatchApiError(
            405, "method_not_allowed",
            f"{request.method} is not allowed here; use {', '.join(methods)}.",
        )  # fmt: skip
    try:
        principal = verify(
            settings.INTERNAL_SECRET, request.headers.get(HEADER),
            method=request.method or "", path=request.path, now=time.time(),
        )  # fmt: skip
    except PrincipalRefusedError as exc:
        raise BatchApiError(401, "invalid_principal", str(exc)) from None
    tenant = Tenant.objects.filter(slug=principal.tenant, status=Tenant.Status.ACTIVE).first()
    if tenant is None:
        raise BatchApiError(401, "invalid_principal", "The tenant is not active.")
    return tenant


def _json_body(request: HttpRequest) -> dict[str, Any]:
    try:
        data = json.loads(request.body or b"{}")
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BatchApiError(400, "invalid_json", "The request body is not valid JSON.") from None
    if not isinstance(data, dict):
        raise BatchApiError(400, "invalid_json", "The request body must be a JSON object.")
    return data


def _page(
    request: HttpRequest, objects: Any, render: Callable[[Any], dict[str, Any]]
) -> HttpResponse:
    """OpenAI's cursor list: newest first, ``after`` an id, ``limit`` (1..100, default 20)."""
    raw = request.GET.get("limit", "20")
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIST_LIMIT:
        raise BatchApiError(400, "invalid_limit", "'limit' must be 1 to 100.", param="limit")
    limit = int(raw)
    after = request.GET.get("after")
    if after:
        anchor = objects.filter(public_id=after).first()
        if anchor is None:
            raise not_found("object", after)
        objects = objects.filter(pk__lt=anchor.pk)
    rows = list(objects.order_by("-pk")[: limit + 1])
    data = [render(row) for row in rows[:limit]]
    return JsonResponse({
        "object": "list", "data": data, "has_more": len(rows) > limit,
        "first_id": data[0]["id"] if data else None, "last_id": data[-1]["id"] if data else None,
    })  # fmt: skip


@batch_api("GET", "POST")
def files(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    if request.method == "GET":
        listed = File.objects.filter(tenant=tenant, deleted_at__isnull=True)
        return _page(request, listed, file_object)
    upload = request.FILES.get("file")
    if upload is None:
        raise BatchApiError(400, "missing_file", "Upload the JSONL as the 'file' field.",
                            param="file")  # fmt: skip
    file = services.file_create(
        tenant=tenant, purpose=request.POST.get("purpose", ""),
        filename=upload.name or "", content=upload.read(),
    )  # fmt: skip
    return JsonResponse(file_object(file))


def _file(tenant: Tenant, file_id: str, *, deleted_ok: bool = False) -> File:
    file = File.objects.filter(tenant=tenant, public_id=file_id).select_related("tenant").first()
    if file is None:
        raise not_found("file", file_id)
    if file.deleted_at is not None and not deleted_ok:
        raise BatchApiError(
            404, "file_deleted",
            f"The file '{file_id}' was deleted by the tenant's data retention (zero retention "
            "or its retention period).",
            param="id",
        )  # fmt: skip
    return file


@batch_api("GET", "DELETE")
def file_detail(request: HttpRequest, tenant: Tenant, file_id: str) -> HttpResponse:
    file = _file(tenant, file_id, deleted_ok=request.method == "DELETE")
    if request.method == "GET":
        return JsonResponse(file_object(file))
    services.file_delete(file)
    return JsonResponse({"id": file_id, "object": "file", "deleted": True})


@batch_api("GET")
def file_content(request: HttpRequest, tenant: Tenant, file_id: str) -> HttpResponse:
    file = _file(tenant, file_id)
    content = services.file_read(file)
    services.file_downloaded(file)  # zero retention: a batch output is read once
    return HttpResponse(content, content_type="application/jsonl")


@batch_api("GET", "POST")
def batches(request: HttpRequest, tenant: Tenant) -> HttpResponse:
    if request.method == "GET":
        listed = Batch.objects.filter(tenant=tenant).select_related(
            "input_file", "output_file", "error_file"
        )
        return _page(request, listed, batch_object)
    data = _json_body(request)
    batch = services.batch_create(
        tenant=tenant, input_file_id=data.get("input_file_id"), endpoint=data.get("endpoint"),
        completion_window=data.get("completion_window"), metadata=data.get("metadata"),
    )  # fmt: skip
    return JsonResponse(batch_object(batch))


def _batch(tenant: Tenant, batch_id: str) -> Batch:
    batch = (
        Batch.objects.filter(tenant=tenant, public_id=batch_id)
        .select_related("input_file", "output_file", "error_file")
        .first()
    )
    if batch is None:
        raise not_found("batch", batch_id)
    return batch


@batch_api("GET")
def batch_detail(request: HttpRequest, tenant: Tenant, batch_id: str) -> HttpResponse:
    return JsonResponse(batch_object(_batch(tenant, batch_id)))


@batch_api("POST")
def batch_cancel(request: HttpRequest, tenant: Tenant, batch_id: str) -> HttpResponse:
    batch = services.batch_cancel(batch=_batch(tenant, batch_id))
    return JsonResponse(batch_object(_batch(tenant, batch.public_id)))
