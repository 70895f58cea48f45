"""Upstream: the only code doing network I/O to workers.

Connection pools per endpoint (:class:`UpstreamClient`), per-attempt timeouts from the
request deadline, retries before the first byte (:func:`open_with_retry`), circuit breakers
(:class:`BreakerBook`) and active health checks (:class:`HealthMonitor`). Nothing here runs
at import time; the app builds these objects in its lifespan and passes them in.
"""

from runtime.upstream.breaker import BreakerBook, BreakerConfig, BreakerState, CircuitBreaker
from runtime.upstream.client import ClientConfig, UpstreamClient, join_url
from runtime.upstream.dispatch import Picker, backoff_delay, open_with_retry
from runtime.upstream.errors import (
    ConnectFailed,
    ConnectionDropped,
    DeadlineExceeded,
    FirstByteTimeout,
    NoEndpointAvailable,
    StreamBroken,
    UpstreamError,
    UpstreamHTTPError,
)
from runtime.upstream.health import EndpointStatus, HealthConfig, HealthMonitor
from runtime.upstream.promtext import parse_samples
from runtime.upstream.response import UpstreamResponse
from runtime.upstream.sse import DONE, SSEDecoder
from runtime.upstream.timeouts import AttemptTimeouts, TimeoutPolicy, attempt_timeouts

__all__ = [
    "DONE",
    "AttemptTimeouts",
    "BreakerBook",
    "BreakerConfig",
    "BreakerState",
    "CircuitBreaker",
    "ClientConfig",
    "ConnectFailed",
    "ConnectionDropped",
    "DeadlineExceeded",
    "EndpointStatus",
    "FirstByteTimeout",
    "HealthConfig",
    "HealthMonitor",
    "NoEndpointAvailable",
    "Picker",
    "SSEDecoder",
    "StreamBroken",
    "TimeoutPolicy",
    "UpstreamClient",
    "UpstreamError",
    "UpstreamHTTPError",
    "UpstreamResponse",
    "attempt_timeouts",
    "backoff_delay",
    "join_url",
    "open_with_retry",
    "parse_samples",
]
