"""OpenAI-style errors: ``{"error": {"message", "type", "param", "code"}}`` with a status.

:data:`ERROR_KINDS` is the one table of what the gateway can answer; raise
``ApiError.of(code, message, param=...)`` so status and type always agree with it.
"""

from __future__ import annotations

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


class ErrorKind(msgspec.Struct, frozen=True):
    status: int
    type: str


ERROR_KINDS: Final[Mapping[str, ErrorKind]] = MappingProxyType(
    {
        # 400: the request is well-formed JSON but asks for something it may not have.
        "invalid_json": ErrorKind(400, INVALID_REQUEST),
        "invalid_header": ErrorKind(400, INVALID_REQUEST),
        "max_tokens_exceeded": ErrorKind(400, INVALID_REQUEST),
        "context_length_exceeded": ErrorKind(400, INVALID_REQUEST),
        "unsupported_model_task": ErrorKind(400, INVALID_REQUEST),
        # 401: who is calling is unknown.
        "missing_api_key": ErrorKind(401, AUTHENTICATION),
        "invalid_api_key": ErrorKind(401, AUTHENTICATION),
        "expired_api_key": ErrorKind(401, AUTHENTICATION),
        # 403: known caller, not allowed.
        "tenant_suspended": ErrorKind(403, PERMISSION),
        "insufficient_scope": ErrorKind(403, PERMISSION),
        "model_not_allowed": ErrorKind(403, PERMISSION),
        "class_not_allowed": ErrorKind(403, PERMISSION),
        "insufficient_credits": ErrorKind(402, "insufficient_quota"),  # 402: credits (#11)
        "budget_exceeded": ErrorKind(402, "insufficient_quota"),
        # 404 / 405: no such thing here.
        "model_not_found": ErrorKind(404, INVALID_REQUEST),
        "unknown_url": ErrorKind(404, INVALID_REQUEST),
        "method_not_allowed": ErrorKind(405, INVALID_REQUEST),
        # 413, 422: the body itself.
        "request_too_large": ErrorKind(413, INVALID_REQUEST),
        "invalid_value": ErrorKind(422, INVALID_REQUEST),
        # 429: not now. Tenant limits, then the pool queue (full, a wait beyond the
        # deadline, or shed under overload). Each carries Retry-After.
        "rate_limit_exceeded": ErrorKind(429, RATE_LIMIT),
        "tokens_per_minute_exceeded": ErrorKind(429, RATE_LIMIT),
        "concurrency_limit_exceeded": ErrorKind(429, RATE_LIMIT),
        "queue_full": ErrorKind(429, RATE_LIMIT),
        "wait_exceeds_deadline": ErrorKind(429, RATE_LIMIT),
        "shed": ErrorKind(429, RATE_LIMIT),
        # 5xx: ours or the fleet's.
        "internal_error": ErrorKind(500, SERVER),
        "upstream_error": ErrorKind(502, UPSTREAM),
        "not_ready": ErrorKind(503, SERVER),
        "no_healthy_endpoint": ErrorKind(503, SERVER),
        "deadline_exceeded": ErrorKind(504, TIMEOUT),
        "upstream_timeout": ErrorKind(504, TIMEOUT),
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
        message: str,
        *,
        param: str | None = None,
        headers: tuple[tuple[bytes, bytes], ...] = (),
        extra: Mapping[str, Any] | None = None,
    ) -> ApiError:
        kind = ERROR_KINDS[code]
        return cls(
            kind.status, message, type=kind.type, code=code, param=param, headers=headers,
            extra=extra,
        )  # fmt: skip

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
    """An upstream 4xx passed back with its status and an OpenAI-shaped body."""
    message = f"the model server refused the request (HTTP {status})"
    param: str | None = None
    try:
        parsed = msgspec.json.decode(body, type=_LooseEnvelope)
    except msgspec.DecodeError:
        parsed = None
    except msgspec.ValidationError:
        parsed = None
    if parsed is not None:
        if parsed.error is not None and parsed.error.message:
            message = parsed.error.message
            param = parsed.error.param
        elif parsed.message:
            message = parsed.message
    return ApiError(status, message, type=INVALID_REQUEST, code="upstream_rejected", param=param)


def as_json(document: Any) -> bytes:
    return _ENCODER.encode(document)
