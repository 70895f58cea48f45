"""Conventions every REST view shares: the error shape, cursor pagination, ETag/If-Match,
per-credential throttling and the OpenAPI post-processing that documents them.

Errors have one shape everywhere::

    {"error": {"code": "invalid", "message": "...", "fields": {"name": ["..."]}}}

``code`` is stable (DRF's ``default_code`` of the exception, plus ``precondition_failed`` and
``precondition_required``); ``fields`` appears for validation errors. A Django
``ValidationError`` raised by a service becomes a 400 whose ``fields`` carry the service's own
messages (non-field messages under ``non_field_errors``).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

from django.core.exceptions import ValidationError as DjangoValidationError
from django.core.serializers.json import DjangoJSONEncoder
from django.db import transaction
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.utils.dateparse import parse_datetime
from django.views import defaults
from rest_framework import exceptions, serializers, status
from rest_framework.pagination import CursorPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle

NON_FIELD = "non_field_errors"
T = TypeVar("T")


class PreconditionFailed(exceptions.APIException):
    status_code = status.HTTP_412_PRECONDITION_FAILED
    default_detail = "The object changed since you read it; fetch it again and retry."
    default_code = "precondition_failed"


class PreconditionRequired(exceptions.APIException):
    status_code = 428
    default_detail = "Send If-Match with the ETag from your last read of this object."
    default_code = "precondition_required"


class Conflict(exceptions.APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the object's current state."
    default_code = "conflict"


def _service_fields(exc: DjangoValidationError) -> dict[str, list[str]]:
    if hasattr(exc, "error_dict"):
        return {
            (NON_FIELD if field == "__all__" else field): [str(m) for m in messages]
            for field, messages in exc.message_dict.items()
        }
    return {NON_FIELD: [str(m) for m in exc.messages]}


def _flatten(detail: Any) -> list[str]:
    if isinstance(detail, dict):
        return [m for value in detail.values() for m in _flatten(value)]
    if isinstance(detail, list):
        return [m for value in detail for m in _flatten(value)]
    return [str(detail)]


def api_exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF's handler, then every error reshaped to ``{"error": {code, message, fields?}}``."""
    if isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(_service_fields(exc))
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    from rest_framework.views import exception_handler  # noqa: PLC0415 - settings import order

    response = exception_handler(exc, context)
    if response is None or not isinstance(exc, exceptions.APIException):
        return response
    body: dict[str, Any]
    if isinstance(exc, exceptions.ValidationError):
        detail = exc.detail
        fields = detail if isinstance(detail, dict) else {NON_FIELD: detail}
        messages = _flatten(fields)
        body = {
            "code": "invalid",
            "message": messages[0] if messages else "Invalid input.",
            "fields": {key: _flatten(value) for key, value in fields.items()},
        }
    else:
        codes = exc.get_codes()
        body = {
            "code": codes if isinstance(codes, str) else exc.default_code,
            "message": " ".join(_flatten(exc.detail)),
        }
    response.data = {"error": body}
    response.content_type = "application/json"  # whatever renderer was negotiated (CSV export)
    return response


class IdCursorPagination(CursorPagination):
    """Opaque-cursor pagination, newest first; ``?page_size=`` up to 500."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


# --- ETag / If-Match -------------------------------------------------------------------------


def etag_of(data: Any) -> str:
    """A strong ETag: the hash of the object's representation."""
    raw = json.dumps(data, sort_keys=True, cls=DjangoJSONEncoder).encode()
    return '"' + hashlib.sha256(raw).hexdigest()[:32] + '"'


def if_match_check(request: Request, current: str) -> None:
    """Refuse an update without If-Match (428) or made against a stale read (412).

    Call it inside the transaction that locked the row, so the check and the write are one.
    """
    header = request.headers.get("If-Match")
    if not header:
        raise PreconditionRequired()
    candidates = [tag.strip().removeprefix("W/") for tag in header.split(",")]
    if "*" not in candidates and current not in candidates:
        raise PreconditionFailed()


def with_etag(response: Response, data: Any) -> Response:
    response["ETag"] = etag_of(data)
    return response


# --- throttling ------------------------------------------------------------------------------


class CredentialThrottle(SimpleRateThrottle):
    """One bucket per management token, per session user, or per client address."""

    scope = "api"

    def get_rate(self) -> str | None:
        # Read live (DRF's class attribute is frozen at import; settings may change in tests).
        from rest_framework.settings import api_settings  # noqa: PLC0415 - import order

        rate = api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)
        return None if rate is None else str(rate)

    def get_cache_key(self, request: Request, view: Any) -> str | None:
        prefix = getattr(request.auth, "prefix", None)
        if isinstance(prefix, str):
            ident = f"token:{prefix}"
        elif request.user is not None and request.user.is_authenticated:
            ident = f"user:{request.user.pk}"
        else:
            ident = f"addr:{self.get_ident(request)}"
        return self.cache_format % {"scope": self.scope, "ident": ident}


# --- OpenAPI ---------------------------------------------------------------------------------

_ERROR_RESPONSES = {
    "400": "Invalid input; `fields` holds the messages.",
    "401": "Not authenticated.",
    "403": "Authenticated, but the role or credential may not do this.",
    "404": "No such object for this credential (other tenants' objects are never shown).",
    "405": "Method not allowed.",
    "406": "Not acceptable.",
    "409": "Conflicts with the current state.",
    "412": "If-Match does not match the current ETag: the object changed since it was read.",
    "415": "Unsupported media type.",
    "428": "If-Match is required on updates.",
    "429": "Throttled; retry after the Retry-After header.",
}


def error_responses_hook(result: dict[str, Any], **_kwargs: Any) -> dict[str, Any]:
    """Document the shared error shape on every operation (drf-spectacular postprocessing)."""
    ref = {"$ref": "#/components/schemas/Error"}
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas["Error"] = {
        "type": "object",
        "required": ["error"],
        "properties": {
            "error": {
                "type": "object",
                "required": ["code", "message"],
                "properties": {
                    "code": {"type": "string", "example": "invalid"},
                    "message": {"type": "string"},
                    "fields": {
                        "type": "object",
                        "additionalProperties": {"type": "array", "items": {"type": "string"}},
                    },
                },
            }
        },
    }
    for path_item in result.get("paths", {}).values():
        for method, operation in path_item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            responses = operation.setdefault("responses", {})
            for code, description in _ERROR_RESPONSES.items():
                content = {"application/json": {"schema": ref}}
                responses.setdefault(code, {"description": description, "content": content})
    return result


def etag_update(
    request: Request,
    *,
    fetch: Callable[[bool], T],
    represent: Callable[[T], Any],
    apply: Callable[[T], object],
) -> Response:
    """An update under If-Match: lock the row, compare ETags, call the service, answer with
    the new representation and its ETag. ``fetch(for_update)`` raises 404 when absent."""
    with transaction.atomic():
        current = fetch(True)
        if_match_check(request, etag_of(represent(current)))
        apply(current)
    data = represent(fetch(False))
    return with_etag(Response(data), data)


def etag_read(data: Any) -> Response:
    return with_etag(Response(data), data)


def _api_error(request: HttpRequest, code: str, message: str, status_code: int) -> HttpResponse:
    return JsonResponse({"error": {"code": code, "message": message}}, status=status_code)


def not_found_handler(request: HttpRequest, exception: Exception) -> HttpResponse:
    """404 for URLs no view matched: the API's error shape under /api/, Django's page elsewhere."""
    if request.path.startswith("/api/"):
        return _api_error(request, "not_found", "No such endpoint or object.", 404)
    return defaults.page_not_found(request, exception)


def server_error_handler(request: HttpRequest) -> HttpResponse:
    if request.path.startswith("/api/"):
        return _api_error(request, "server_error", "Internal server error.", 500)
    return defaults.server_error(request)


def time_param(request: Request, name: str) -> datetime | None:
    """An ISO 8601 query parameter with a time zone, as UTC; a 400 on ``name`` otherwise."""
    raw = request.query_params.get(name)
    if not raw:
        return None
    try:
        moment = parse_datetime(raw)
        moment = moment.astimezone(UTC) if moment is not None and moment.tzinfo else None
    except (ValueError, OverflowError):
        moment = None
    if moment is None:
        raise exceptions.ValidationError(
            {name: "Give an ISO 8601 time with a time zone, e.g. 2026-11-22T00:00:00Z."}
        )
    return moment


class TaskAcceptedSerializer(serializers.Serializer[Any]):
    """A queued Celery task: its id and where to read its state (202 answers)."""

    task_id = serializers.CharField()
    status_url = serializers.CharField()


def accepted(request: Request, task_id: str) -> Response:
    """202 Accepted for a queued Celery task (``/api/v1/ops/tasks/<id>/`` reads its state)."""
    url = request.build_absolute_uri(f"/api/v1/ops/tasks/{task_id}/")
    return Response({"task_id": task_id, "status_url": url}, status=status.HTTP_202_ACCEPTED)


def validated_body(serializer_class: type[serializers.Serializer[Any]], request: Request) -> Any:
    """The request body validated by ``serializer_class`` (a 400 in the error shape when not):
    types only; the service called next checks the values."""
    body = serializer_class(data=request.data)
    body.is_valid(raise_exception=True)
    return body.validated_data
