"""Upstream failures, classified by what the caller may do next.

Before the first byte a failure is *retryable* on another endpoint (``retryable``) and may
count against the endpoint's circuit breaker (``endpoint_fault``). After the first byte
nothing is retried: the stream ends with :class:`StreamBroken` and the gateway closes the
client's stream with a terminal error event (finish reason ``error``).
"""

from __future__ import annotations


class UpstreamError(Exception):
    """Base of every error raised by :mod:`runtime.upstream`."""

    retryable: bool = False
    endpoint_fault: bool = False

    def __init__(self, message: str, *, endpoint_id: int | None = None) -> None:
        super().__init__(message)
        self.endpoint_id = endpoint_id


class ConnectFailed(UpstreamError):  # noqa: N818 (names of the upstream contract)
    """The TCP connection could not be made (refused, unreachable, connect timeout)."""

    retryable = True
    endpoint_fault = True


class ConnectionDropped(UpstreamError):  # noqa: N818 (names of the upstream contract)
    """The endpoint closed or reset the connection before the first byte of the response."""

    retryable = True
    endpoint_fault = True


class FirstByteTimeout(UpstreamError):  # noqa: N818 (names of the upstream contract)
    """No first byte (status line, and the first event of a stream) within the TTFT cap."""

    retryable = True
    endpoint_fault = True


class UpstreamHTTPError(UpstreamError):
    """The endpoint answered with a non-2xx status.

    5xx is the endpoint's fault and retryable elsewhere. 429 is the endpoint shedding load:
    retryable elsewhere, but not a breaker failure. Any other 4xx is the client's request
    being refused (for example a prompt longer than the model's context): passed back as is.
    """

    def __init__(
        self,
        status: int,
        body: bytes,
        *,
        endpoint_id: int | None = None,
        content_type: str = "",
    ) -> None:
        super().__init__(f"upstream answered HTTP {status}", endpoint_id=endpoint_id)
        self.status = status
        self.body = body
        self.content_type = content_type
        self.retryable = status >= 500 or status == 429
        self.endpoint_fault = status >= 500


class StreamBroken(UpstreamError):  # noqa: N818 (names of the upstream contract)
    """The response failed after its first byte; what was already relayed stands.

    ``reason`` is one of ``"disconnected"`` (reset, EOF or a malformed body),
    ``"truncated"`` (the stream ended without ``[DONE]``), ``"stalled"`` (no bytes for the
    idle cap), ``"engine_error"`` (the engine sent an error event in the stream) or
    ``"deadline"`` (the request's deadline passed; not the endpoint's fault).
    """

    def __init__(self, message: str, *, reason: str, endpoint_id: int | None = None) -> None:
        super().__init__(message, endpoint_id=endpoint_id)
        self.reason = reason
        self.endpoint_fault = reason != "deadline"


class DeadlineExceeded(UpstreamError):  # noqa: N818 (names of the upstream contract)
    """The request's deadline passed before a first byte arrived."""


class NoEndpointAvailable(UpstreamError):  # noqa: N818 (names of the upstream contract)
    """No endpoint is left to try: all were tried, refused by their breaker, or none exist."""
