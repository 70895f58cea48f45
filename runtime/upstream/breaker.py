"""Circuit breakers, one per endpoint.

``closed`` admits everything and counts consecutive failures; ``failure_threshold`` of them
open it. ``open`` refuses everything for ``cooldown_s``; then the next request to ask is
admitted as the single half-open probe. The probe's success closes the breaker, its failure
re-opens it for another cooldown, and a probe that ends without a verdict (cancelled, or
the request's own deadline ran out) gives the probe slot back.

The clock is injected (``time.monotonic`` by default) so tests drive time explicitly.
A book's ``on_success`` hears the endpoint id of every success a breaker records: the gateway
passes :meth:`HealthMonitor.note_success <runtime.upstream.health.HealthMonitor.note_success>`,
so real traffic that succeeds is passive health evidence.
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.upstream.errors import StreamBroken


class BreakerState(enum.Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True, slots=True)
class BreakerConfig:
    failure_threshold: int = 5
    cooldown_s: float = 5.0

    def __post_init__(self) -> None:
        if self.failure_threshold < 1:
            raise ValueError("failure_threshold must be >= 1")
        if self.cooldown_s < 0:
            raise ValueError("cooldown_s must be >= 0")


class CircuitBreaker:
    """The breaker of one endpoint. Not thread-safe; lives on one event loop."""

    __slots__ = (
        "_clock",
        "_config",
        "_failures",
        "_on_success",
        "_opened_at",
        "_probe_out",
        "_state",
        "stream_listener",
    )

    def __init__(
        self,
        config: BreakerConfig,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_success: Callable[[], None] | None = None,
    ) -> None:
        self._config = config
        self._clock = clock
        self._on_success = on_success
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._opened_at = 0.0
        self._probe_out = False
        # A stream's broken-listener (UpstreamResponse.set_broken_listener): one bound method
        # made here, not a closure per request (issue #27).
        self.stream_listener: Callable[[StreamBroken], None] = self._stream_broke

    def _stream_broke(self, error: StreamBroken) -> None:
        """A stream from this endpoint broke: a failure when it was the endpoint's fault."""
        if error.endpoint_fault:
            self.record_failure()

    @property
    def state(self) -> BreakerState:
        """The state now; an open breaker whose cooldown has elapsed reads as half-open."""
        if self._state is BreakerState.OPEN and self._cooled_down():
            return BreakerState.HALF_OPEN
        return self._state

    @property
    def consecutive_failures(self) -> int:
        return self._failures

    def available(self) -> bool:
        """Would :meth:`try_acquire` admit a request now? (No side effect; for filters.)"""
        if self._state is BreakerState.CLOSED:  # asked per endpoint per request: no property
            return True
        return self.state is BreakerState.HALF_OPEN and not self._probe_out

    def try_acquire(self) -> bool:
        """Admit one request, or refuse it. In half-open, admits exactly one probe."""
        if self._state is BreakerState.CLOSED:
            return True
        if self._state is BreakerState.OPEN:
            if not self._cooled_down():
                return False
            self._state = BreakerState.HALF_OPEN
            self._probe_out = False
        if self._probe_out:
            return False
        self._probe_out = True
        return True

    def record_success(self) -> None:
        """The endpoint answered: close the breaker and forget past failures."""
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._probe_out = False
        if self._on_success is not None:
            self._on_success()

    def record_failure(self) -> None:
        """The endpoint failed: count it; open at the threshold, re-open from half-open."""
        self._failures += 1
        self._probe_out = False
        if self._state is BreakerState.HALF_OPEN or (
            self._state is BreakerState.CLOSED and self._failures >= self._config.failure_threshold
        ):
            self._open()
        elif self._state is BreakerState.OPEN:
            # A request admitted before the breaker opened failed late: restart the cooldown.
            self._opened_at = self._clock()

    def release(self) -> None:
        """An admitted request ended without a verdict on the endpoint (e.g. cancelled)."""
        if self._state is BreakerState.HALF_OPEN:
            self._probe_out = False

    def _open(self) -> None:
        self._state = BreakerState.OPEN
        self._opened_at = self._clock()

    def _cooled_down(self) -> bool:
        return self._clock() - self._opened_at >= self._config.cooldown_s


class BreakerBook:
    """The breakers of all endpoints, keyed by endpoint id, created on first use."""

    __slots__ = ("_breakers", "_clock", "_config", "_on_success")

    def __init__(
        self,
        config: BreakerConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        on_success: Callable[[int], None] | None = None,
    ) -> None:
        self._config = config or BreakerConfig()
        self._clock = clock
        self._on_success = on_success
        self._breakers: dict[int, CircuitBreaker] = {}

    def get(self, endpoint_id: int) -> CircuitBreaker:
        breaker = self._breakers.get(endpoint_id)
        if breaker is None:
            tell = self._on_success
            on_success = None if tell is None else functools.partial(tell, endpoint_id)
            breaker = CircuitBreaker(self._config, clock=self._clock, on_success=on_success)
            self._breakers[endpoint_id] = breaker
        return breaker

    def available(self, endpoint_id: int) -> bool:
        """Filter for routing: False while the endpoint's breaker would refuse a request."""
        breaker = self._breakers.get(endpoint_id)
        return breaker is None or breaker.available()

    def retain(self, endpoint_ids: Iterable[int]) -> None:
        """Forget breakers of endpoints no longer in the snapshot."""
        keep = set(endpoint_ids)
        for endpoint_id in [e for e in self._breakers if e not in keep]:
            del self._breakers[endpoint_id]

    def states(self) -> dict[int, BreakerState]:
        return {endpoint_id: b.state for endpoint_id, b in self._breakers.items()}
