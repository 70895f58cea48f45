"""What a queued request is, and the narrow policy interfaces the pool queue is built from.

Every policy is a small object with a ``name`` class attribute (its registry key, see
:mod:`runtime.scheduling.registry`) and no hidden state: whatever it must remember lives in
a state object it creates (:meth:`FairnessPolicy.new_state`) and the caller keeps.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import ClassVar, Final, Protocol, TypeVar

OUTPUT_TOKEN_WEIGHT: Final = 2.0
"""An output token costs this many input tokens (VTC's ``w_q / w_p``; decode is dearer)."""

S = TypeVar("S")


def token_cost(input_tokens: float, output_tokens: float) -> float:
    """The service a request represents: input tokens + 2 * output tokens."""
    return input_tokens + OUTPUT_TOKEN_WEIGHT * output_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class QueuedRequest:
    """One request waiting in a pool queue. Immutable; the queue only stores and orders it.

    ``deadline`` and ``arrived_at`` are absolute times on the router's monotonic clock
    (``math.inf``: no deadline). ``seq`` is the router's arrival sequence number: unique and
    increasing, it breaks every tie so the order is deterministic. ``band`` comes from the
    request class (0 is the most urgent); ``shed_order`` too (lower is shed first).
    """

    id: str
    tenant: str
    band: int
    class_name: str
    input_tokens: int
    max_output_tokens: int
    seq: int
    arrived_at: float = 0.0
    deadline: float = math.inf
    weight: float = 1.0
    shed_order: int = 0
    is_shadow: bool = False
    over_quota: bool = False
    expected_output_tokens: int | None = None  # a better guess than max_output_tokens, if any
    resumes: bool = False  # a preempted request that goes first among its tenant's (resume_first)

    def __post_init__(self) -> None:
        if self.input_tokens < 0 or self.max_output_tokens < 0:
            raise ValueError(f"request {self.id!r}: token counts must be >= 0")
        if (self.expected_output_tokens or 0) < 0:
            raise ValueError(f"request {self.id!r}: expected_output_tokens must be >= 0")
        if not self.weight > 0 or math.isinf(self.weight):
            raise ValueError(f"request {self.id!r}: weight must be a positive finite number")

    @property
    def cost(self) -> float:
        """Estimated token cost: input + 2 * (expected, else maximum) output tokens."""
        output = self.expected_output_tokens
        return token_cost(self.input_tokens, self.max_output_tokens if output is None else output)


class DropReason(enum.StrEnum):
    """Why a request left the queue (or never entered it) without reaching an engine."""

    QUEUE_FULL = "queue_full"  # its band's (or the pool's) bound was hit: 429
    WAIT_EXCEEDS_DEADLINE = "wait_exceeds_deadline"  # predicted wait > deadline: 429
    SHED = "shed"  # displaced by a less sheddable request under overload: 429
    DEADLINE_EXPIRED = "deadline_expired"  # its deadline passed while queued: 504
    CANCELLED = "cancelled"  # the client went away


class FairnessPolicy(Protocol[S]):
    """Which backlogged tenant of a band is served next.

    A tenant is *backlogged* while it has at least one queued request in the band.
    """

    name: ClassVar[str]
    isolates_tenants: ClassVar[bool]
    """Whether the policy protects tenants from each other (then the dispatcher also keeps
    headroom for tenants below their share, see :mod:`runtime.scheduling.headroom`)."""

    def new_state(self) -> S:
        """Fresh per-band state (counters, turn order, ...)."""
        ...

    def on_backlogged(self, state: S, tenant: str, active: Collection[str]) -> None:
        """``tenant`` just became backlogged; ``active`` are the others already backlogged."""
        ...

    def pick(self, state: S, heads: Mapping[str, QueuedRequest]) -> str:
        """Choose one key of ``heads`` (each backlogged tenant's next request). Non-empty."""
        ...

    def charge(
        self,
        state: S,
        tenant: str,
        *,
        weight: float,
        input_tokens: int = 0,
        output_tokens: int = 0,
    ) -> None:
        """Account service: input tokens at dispatch, output tokens as they stream back."""
        ...

    def counter(self, state: S, tenant: str) -> float:
        """The tenant's service counter (weighted tokens; VTC's virtual counter). Never falls."""
        ...

    def lift(self, state: S, tenant: str, value: float) -> None:
        """Raise the tenant's counter to at least ``value`` (service counted elsewhere)."""
        ...


class OrderingPolicy(Protocol):
    """Which of one tenant's queued requests goes first. ``less`` is a strict weak order."""

    name: ClassVar[str]

    def less(self, a: QueuedRequest, b: QueuedRequest) -> bool: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class EndpointLoad:
    """What the last ``/metrics`` scrape of an endpoint said, and how old that is.

    ``None`` means unknown (never scraped, or the engine did not export it).
    """

    kv_usage: float | None = None  # vllm:kv_cache_usage_perc, 0..1
    waiting: float | None = None  # vllm:num_requests_waiting
    age_s: float | None = None  # seconds since that scrape


class SaturationDetector(Protocol):
    """Whether an endpoint can take one more request now.

    ``inflight`` is the router's own count for the endpoint (the immediate signal);
    ``capacity`` its configured concurrency; ``metrics`` the scraped engine state.
    """

    name: ClassVar[str]

    def has_room(self, *, inflight: int, capacity: int, metrics: EndpointLoad) -> bool: ...
