"""What the client hears when the upstream could not be opened (before the first byte)."""

from __future__ import annotations

from runtime.gateway.errors import ApiError, upstream_refusal
from runtime.upstream.errors import (
    ConnectFailed,
    ConnectionDropped,
    DeadlineExceeded,
    FirstByteTimeout,
    NoEndpointAvailable,
    UpstreamError,
    UpstreamHTTPError,
)


def dispatch_error(error: UpstreamError, *, model: str) -> ApiError:
    """Map the failure :func:`open_with_retry` raised onto an OpenAI error answer."""
    if isinstance(error, DeadlineExceeded):
        return ApiError.of("deadline_exceeded", when="before the model answered")
    if isinstance(error, NoEndpointAvailable | ConnectFailed | ConnectionDropped):
        return ApiError.of("no_healthy_endpoint", model=model, reason="none could be reached")
    if isinstance(error, FirstByteTimeout):
        return ApiError.of("upstream_timeout", model=model)
    if isinstance(error, UpstreamHTTPError):
        if error.status == 429:
            return ApiError.of(
                "no_healthy_endpoint", model=model, reason="every endpoint is overloaded"
            )
        if error.status < 500:
            return upstream_refusal(error.status, error.body)
    return ApiError.of("upstream_error", reason=str(error))
