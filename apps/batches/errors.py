"""The Batch API's refusals, in OpenAI's error shape (``{"error": {...}}``)."""

from __future__ import annotations

import json
from typing import Any

_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "invalid_request_error",
          413: "invalid_request_error", 409: "invalid_request_error"}  # fmt: skip


class BatchApiError(Exception):
    """A refusal with its HTTP status, code and message (and the input line, when one)."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        line: int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.line = line

    def document(self) -> dict[str, Any]:
        error: dict[str, Any] = {
            "message": self.message,
            "type": _TYPES.get(self.status, "server_error"),
            "param": self.param,
            "code": self.code,
        }
        if self.line is not None:
            error["line"] = self.line
        return {"error": error}

    def body(self) -> bytes:
        return json.dumps(self.document()).encode()


def not_found(kind: str, object_id: str) -> BatchApiError:
    """Another tenant's id reads the same as no such id."""
    return BatchApiError(404, "not_found", f"No such {kind}: '{object_id}'.", param="id")
