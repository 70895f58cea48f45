"""Per-attempt timeouts derived from the request's absolute deadline.

Deadlines are absolute times on the event loop's clock (``loop.time()``). Every attempt
gets: a connect timeout (``min(remaining, connect_cap)``), a first-byte timeout
(``min(remaining, first_byte_cap)``, covering the status line and, for a stream, its first
event) and a total equal to what remains of the deadline. An optional idle cap bounds the
silence between two reads of the body.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import aiohttp

from runtime.upstream.errors import DeadlineExceeded

# aiohttp rounds timeouts above this many seconds up to whole seconds; we never want that.
_NO_CEIL = 1e9


@dataclass(frozen=True, slots=True)
class TimeoutPolicy:
    """Caps applied to every attempt; ``math.inf`` means "as long as the deadline allows"."""

    connect_cap: float = 2.0
    first_byte_cap: float = 30.0
    idle_cap: float = math.inf

    def __post_init__(self) -> None:
        for name in ("connect_cap", "first_byte_cap", "idle_cap"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")


@dataclass(frozen=True, slots=True)
class AttemptTimeouts:
    """Relative timeouts (seconds) for one attempt, all ≤ ``total``."""

    connect: float
    first_byte: float
    total: float
    idle: float | None

    def client_timeout(self) -> aiohttp.ClientTimeout:
        """The aiohttp timeout for the attempt (the first byte is enforced by the caller)."""
        return aiohttp.ClientTimeout(
            total=self.total,
            connect=None,
            sock_connect=self.connect,
            sock_read=self.idle,
            ceil_threshold=_NO_CEIL,
        )


def attempt_timeouts(
    policy: TimeoutPolicy,
    *,
    deadline: float,
    now: float,
    first_byte_cap: float | None = None,
) -> AttemptTimeouts:
    """Timeouts for an attempt starting at ``now``; raises DeadlineExceeded if none is left.

    ``first_byte_cap`` overrides the policy's cap for this attempt (a unary request passes
    ``math.inf``: its first byte only comes when the whole answer is ready).
    """
    if not math.isfinite(deadline):
        raise ValueError("deadline must be a finite loop time")
    remaining = deadline - now
    if not remaining > 0:
        raise DeadlineExceeded("deadline passed before the attempt")
    fb_cap = policy.first_byte_cap if first_byte_cap is None else first_byte_cap
    return AttemptTimeouts(
        connect=min(remaining, policy.connect_cap),
        first_byte=min(remaining, fb_cap),
        total=remaining,
        idle=None if math.isinf(policy.idle_cap) else min(remaining, policy.idle_cap),
    )
