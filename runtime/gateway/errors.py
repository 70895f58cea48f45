"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with a status.

:data:`ERROR_KINDS` is the one table of what the gateway can answer: each code carries its
HTTP status, its OpenAI ``type`` and a message template. ``ApiError.of(code, **fields)`` fills
the template (``ApiError.of("model_not_found", model="x", param="model")``), so status, type
and wording always come from the table; a code missing from the table is a ``KeyError`` at the
raise, and tests/runtime/gateway/test_gateway_units.py checks every code the gateway
names. The mid-stream terminal errors (``stream_broken``, ``deadline_exceeded``,
``router_shutdown``) and upstream refusals
(``upstream_rejected``, whose status is the engine's own 4xx) read the same table.
"""

from __future__ import annotations

import string
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, Final

import msgspec

INVALID_REQUEST = "invalid_request_error"
AUTHENTICATION = "authentication_error"
PERMISSION = "permission_error"
SERVER = "server_error"
TIMEOUT = "timeout_error"
UPSTREAM = "upstream_error"
RATE_LIMIT = "rate_limit_error"
INSUFFICIENT_QUOTA = "insufficient_quota"

NO_SNAPSHOT: Final = "it has no configuration snapshot yet"  # not_ready's usual reason


class ErrorKind(msgspec.Struct, frozen=True):
    status: int
    type: str
    template: str  # str.format fields, filled by ApiError.of(code, **fields)
    passthrough_status: bool = False  # the status comes from the engine (a 4xx)

    def fields(self) -> frozenset[str]:
        """The names the template needs."""
        return frozenset(name for _, name, _, _ in string.Formatter().parse(self.template) if name)


ERROR_KINDS: Final[Mapping[str, ErrorKind]] = MappingProxyType(
    {
        # 400: the request is malformed or asks for something it may not have.
        "invalid_json": ErrorKind(
            400, INVALID_REQUEST, "The request body is not valid JSON: {reason}"
        ),
        "invalid_value": ErrorKind(400, INVALID_REQUEST, "Invalid request: {reason}"),
        "unsupported_parameter": ErrorKind(
            400, INVALID_REQUEST, "The parameter '{param}' is not accepted for the model '{model}'."
        ),
        "invalid_header": ErrorKind(400, INVALID_REQUEST, "{header} {reason}"),
        "content_policy_violation": ErrorKind(
            400,
            INVALID_REQUEST,
            "The request was refused by content policy '{pack}', rule '{rule}'{how}.",
        ),
        "bad_http_request": ErrorKind(400, INVALID_REQUEST, "Invalid HTTP request: {reason}."),
        "idempotency_key_reused": ErrorKind(
            400,
            INVALID_REQUEST,
            "This Idempotency-Key was already used with a different request.",
        ),
        "idempotency_key_in_progress": ErrorKind(
            409,
            INVALID_REQUEST,
            "A request with this Idempotency-Key is still running; retry later.",
        ),
        "max_tokens_exceeded": ErrorKind(
            400,
            INVALID_REQUEST,
            "{param} asks for {requested} output tokens, above this tenant's limit of {cap}.",
        ),
        "context_length_exceeded": ErrorKind(400, INVALID_REQUEST, "{reason}"),
        "model_alias_unfit": ErrorKind(
            400, INVALID_REQUEST, "No model of the alias '{model}' fits this request: {reason}."
        ),
        "unsupported_model_task": ErrorKind(
            400,
            INVALID_REQUEST,
            "The model '{model}' is a {task} model; it is not served on {route}.",
        ),
        # 4xx from the engine, passed back with the engine's status and message.
        "upstream_rejected": ErrorKind(
            400,
            INVALID_REQUEST,
            "The model server refused the request (HTTP {status}).",
            passthrough_status=True,
        ),
        # 401: who is calling is unknown.
        "missing_api_key": ErrorKind(401, AUTHENTICATION, "{reason}"),
        "invalid_api_key": ErrorKind(401, AUTHENTICATION, "Incorrect API key provided."),
        "expired_api_key": ErrorKind(401, AUTHENTICATION, "This API key has expired."),
        "invalid_batch_line": ErrorKind(
            401, AUTHENTICATION, "The X-Switchyard-Batch-Line mark is refused: {reason}."
        ),
        # 403: known caller, not allowed.
        "tenant_suspended": ErrorKind(403, PERMISSION, "The tenant of this API key is {state}."),
        "insufficient_scope": ErrorKind(403, PERMISSION, "This API key lacks the '{scope}' scope."),
        "model_not_allowed": ErrorKind(
            403, PERMISSION, "Your tenant is not allowed to use the model '{model}'."
        ),
        "class_not_allowed": ErrorKind(
            403,
            PERMISSION,
            "Request class '{klass}' is not available to your tenant (allowed: {allowed}).",
        ),
        # 402: the tenant's credits or budget do not cover the request's worst case.
        "insufficient_credits": ErrorKind(402, INSUFFICIENT_QUOTA, "{reason}"),
        "budget_exceeded": ErrorKind(402, INSUFFICIENT_QUOTA, "{reason}"),
        # 404 / 405: no such thing here.
        "model_not_found": ErrorKind(404, INVALID_REQUEST, "The model '{model}' does not exist."),
        "unknown_url": ErrorKind(404, INVALID_REQUEST, "Unknown request URL: {path}."),
        "method_not_allowed": ErrorKind(
            405, INVALID_REQUEST, "{method} is not allowed here; use {allowed}."
        ),
        # 408, 413, 431: the request itself, before it is understood.
        "request_timeout": ErrorKind(
            408, INVALID_REQUEST, "The request body did not arrive within {seconds} seconds."
        ),
        "request_too_large": ErrorKind(
            413, INVALID_REQUEST, "The request body is over {cap} bytes."
        ),
        "upload_too_large": ErrorKind(
            413, INVALID_REQUEST, "The upload is over {cap} bytes (the Batch API's file cap)."
        ),
        "headers_too_large": ErrorKind(
            431, INVALID_REQUEST, "The request line and headers are over {cap} bytes."
        ),
        # 429: not now. Tenant limits, then the pool queue (full, a wait beyond the
        # deadline, or shed under overload). Each carries Retry-After.
        "rate_limit_exceeded": ErrorKind(429, RATE_LIMIT, "{reason}"),
        "tokens_per_minute_exceeded": ErrorKind(429, RATE_LIMIT, "{reason}"),
        "concurrency_limit_exceeded": ErrorKind(429, RATE_LIMIT, "{reason}"),
        "queue_full": ErrorKind(429, RATE_LIMIT, "The model '{model}' is overloaded: {reason}."),
        "wait_exceeds_deadline": ErrorKind(
            429, RATE_LIMIT, "The model '{model}' is overloaded: {reason}."
        ),
        "shed": ErrorKind(429, RATE_LIMIT, "The model '{model}' is overloaded: {reason}."),
        "adapter_slots_pinned": ErrorKind(
            429,
            RATE_LIMIT,
            "Every adapter slot of the replica for '{model}' holds an adapter loaded too "
            "recently to evict; retry later.",
        ),
        # 5xx: ours or the fleet's.
        "internal_error": ErrorKind(500, SERVER, "Internal error."),
        "upstream_error": ErrorKind(502, UPSTREAM, "The model server failed: {reason}"),
        "stream_broken": ErrorKind(502, UPSTREAM, "upstream failed mid-stream"),
        "not_ready": ErrorKind(503, SERVER, "The router is not ready: {reason}."),
        # the router's SIGTERM grace period ended with this request still running
        "router_shutdown": ErrorKind(
            503, SERVER, "The router is shutting down; its grace period for this request ended."
        ),
        "adapter_load_failed": ErrorKind(
            503, SERVER, "The adapter '{model}' could not be loaded: {reason}."
        ),
        "batch_api_unavailable": ErrorKind(
            503, SERVER, "The Batch API is not available: {reason}."
        ),
        "no_healthy_endpoint": ErrorKind(
            503, SERVER, "No healthy endpoint is available for the model '{model}': {reason}."
        ),
        "deadline_exceeded": ErrorKind(504, TIMEOUT, "The request's deadline passed {when}."),
        "upstream_timeout": ErrorKind(
            504, TIMEOUT, "No endpoint of the model '{model}' answered in time."
        ),
    }
)


class _ErrorDetail(msgspec.Struct, omit_defaults=False):
    message: str
    type: str
    param: str | None
    code: str | None


class _ErrorEnvelope(msgspec.Struct):
    error: _ErrorDetail


_ENCODER = msgspec.json.Encoder()


def error_body(
    message: str,
    *,
    type: str,
    code: str | None,
    param: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> bytes:
    """The OpenAI error document, as JSON bytes; ``extra`` fields join the error object
    (``queue_position`` and ``estimated_wait_s`` of a queue refusal)."""
    if extra:
        detail = {"message": message, "type": type, "param": param, "code": code, **extra}
        return _ENCODER.encode({"error": detail})
    return _ENCODER.encode(_ErrorEnvelope(_ErrorDetail(message, type, param, code)))


def retry_after(seconds: int) -> tuple[tuple[bytes, bytes], ...]:
    """A ``Retry-After`` header (whole seconds, at least 1)."""
    return ((b"retry-after", str(max(1, seconds)).encode("ascii")),)


class ApiError(Exception):
    """An error answer: raise it anywhere on the request path before the response starts."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str,
        code: str | None,
        param: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.code = code
        self.param = param
        self.headers = headers
        self.extra = extra

    @classmethod
    def of(
        cls,
        code: str,
        message: str | None = None,
        *,
        param: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        extra: Mapping[str, Any] | None = None,
        status: int | None = None,
        **fields: object,
    ) -> ApiError:
        """The error ``code`` of :data:`ERROR_KINDS`, its template filled from ``fields``
        (and ``param``): a limit's explanation or the engine's own text travels as a field
        value (``reason=...``). ``message`` replaces the template; the gateway never passes
        it (tests/contracts/test_error_templates.py) except :func:`upstream_refusal`, which
        returns the engine's 4xx message verbatim. ``status`` is honoured only for codes
        whose status is the engine's (``upstream_rejected``)."""
        kind = ERROR_KINDS[code]
        if message is None:
            message = kind.template.format_map({"param": param, "status": status, **fields})
        if status is None or not kind.passthrough_status:
            status = kind.status
        return cls(
            status, message, type=kind.type, code=code, param=param, headers=headers,
            extra=extra,
        )  # fmt: skip

    def document(self) -> dict[str, Any]:
        """The ``error`` object as plain data (for a terminal chunk of a stream)."""
        return {"message": self.message, "type": self.type, "param": self.param, "code": self.code}

    def body(self) -> bytes:
        return error_body(
            self.message, type=self.type, code=self.code, param=self.param, extra=self.extra
        )


class _LooseError(msgspec.Struct):
    message: str | None = None
    type: str | None = None
    param: str | None = None
    code: str | int | None = None


class _LooseEnvelope(msgspec.Struct):
    error: _LooseError | None = None
    message: str | None = None  # vLLM's flat {"object": "error", "message": ...}
    type: str | None = None


def upstream_refusal(status: int, body: bytes) -> ApiError:
    """An upstream 4xx passed back with its status and an OpenAI-shaped body: the engine's
    message and ``param`` when its body has them, else the table's template."""
    message: str | None = None
    param: str | None = None
    try:
        parsed = msgspec.json.decode(body, type=_LooseEnvelope)
    except (msgspec.DecodeError, UnicodeDecodeError):  # ValidationError is a DecodeError
        parsed = None
    if parsed is not None:
        if parsed.error is not None and parsed.error.message:
            message = parsed.error.message
            param = parsed.error.param
        elif parsed.message:
            message = parsed.message
    return ApiError.of("upstream_rejected", message, param=param, status=status)


def as_json(document: Any) -> bytes:
    return _ENCODER.encode(document)
