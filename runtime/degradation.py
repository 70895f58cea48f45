"""Degradation policies: lower a request's quality before its availability, chosen by name.

A pool's ``policies`` (``PoolSnap.policies``) name the policy per request class:

- ``degrade``: ``"cap_tokens"`` (every class) or ``"interactive:cap_tokens,batch:fallback"``
  (per class; an item without a class is the default of the classes not named); unnamed
  classes, and requests without a class, use ``off``;
- ``degrade_wait_ms``: the pool's measured queue wait (the age of the oldest request waiting
  in the class's band or a more urgent one) from which a policy acts; default: the class's
  ``ttft_slo_ms`` (1000 without a class);
- ``degrade_max_tokens``: the per-choice ``max_tokens`` that ``cap_tokens`` caps to (128).

The policies (one tuple, :data:`DEGRADATION_POLICIES`, looked up by name as in
:mod:`runtime.scheduling.registry`):

- ``off`` (the default): never degrades. Degrading changes what the client gets back (a
  shorter answer, another model), so an operator opts in per class;
- ``cap_tokens``: when the wait passes the threshold, cap ``max_tokens`` (the engine ends the
  generation with ``finish_reason: "length"``);
- ``fallback``: when the model has a ``fallback`` (``ModelSnap.fallback``) and its version's
  endpoints are all behind open breakers, or it has none, or the wait passes the threshold,
  serve the request with the fallback model.

Decisions are pure (a :class:`PoolState` in, a :class:`Decision` or None out); the stage
:mod:`runtime.gateway.pipeline.stages.degrade` measures the state and applies them. Shedding
is unchanged: a request that is not degraded queues, and is shed, as before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Final, Protocol

from runtime.policy_names import UnknownPolicyError, by_name, lookup

DEGRADE_KEYS: Final = ("degrade", "degrade_wait_ms", "degrade_max_tokens")
DEFAULT_POLICY: Final = "off"
DEFAULT_WAIT_MS: Final = 1000  # without a class (a class's own default is its TTFT SLO)
DEFAULT_MAX_TOKENS: Final = 128

# Why a policy acted (the ``reason`` label of ``switchyard_degraded_total``).
QUEUE_WAIT: Final = "queue_wait"
BREAKER_OPEN: Final = "breaker_open"
NO_ENDPOINT: Final = "no_endpoint"


@dataclass(frozen=True, slots=True)
class PoolState:
    """What the stage measured of the primary pool for one request."""

    queue_wait_s: float  # age of the oldest request waiting in the band or a more urgent one
    unavailable: str = ""  # "" (some endpoint usable), BREAKER_OPEN or NO_ENDPOINT


@dataclass(frozen=True, slots=True)
class Limits:
    """One request's thresholds: the wait from which to act and the cap to apply."""

    wait_s: float
    max_tokens: int  # cap_tokens: per-choice cap
    asked_tokens: int  # the request's per-choice max_tokens now (0: not a generation)
    has_fallback: bool


@dataclass(frozen=True, slots=True)
class Decision:
    action: str  # the policy's name: "cap_tokens" | "fallback"
    reason: str  # QUEUE_WAIT | BREAKER_OPEN | NO_ENDPOINT
    max_tokens: int = 0  # cap_tokens: the new per-choice max_tokens


class DegradationPolicy(Protocol):
    name: ClassVar[str]

    def decide(self, state: PoolState, limits: Limits) -> Decision | None: ...


class Off:
    name: ClassVar[str] = "off"

    def decide(self, state: PoolState, limits: Limits) -> Decision | None:
        return None


class CapTokens:
    name: ClassVar[str] = "cap_tokens"

    def decide(self, state: PoolState, limits: Limits) -> Decision | None:
        if state.queue_wait_s < limits.wait_s or limits.asked_tokens <= limits.max_tokens:
            return None
        return Decision(self.name, QUEUE_WAIT, max_tokens=limits.max_tokens)


class Fallback:
    name: ClassVar[str] = "fallback"

    def decide(self, state: PoolState, limits: Limits) -> Decision | None:
        if not limits.has_fallback:
            return None
        if state.unavailable:
            return Decision(self.name, state.unavailable)
        if state.queue_wait_s >= limits.wait_s:
            return Decision(self.name, QUEUE_WAIT)
        return None


DEGRADATION_POLICIES: Final = (Off, CapTokens, Fallback)


def names() -> tuple[str, ...]:
    """The registered policies' names, sorted."""
    return tuple(sorted(by_name("degradation", DEGRADATION_POLICIES)))


def degradation_policy(name: str) -> DegradationPolicy:
    """A new instance of the policy called ``name`` (UnknownPolicyError if none)."""
    policy: DegradationPolicy = lookup(
        "degradation policy", by_name("degradation", DEGRADATION_POLICIES), name
    )()
    return policy


class DegradeSettingsError(ValueError):
    """A ``degrade*`` pool policy value that cannot be used."""


def _positive(policies: Mapping[str, str], key: str) -> int | None:
    raw = policies.get(key)
    if raw is None:
        return None
    try:
        value = int(raw.strip())
    except ValueError:
        value = 0
    if value < 1:
        raise DegradeSettingsError(f"{key} must be a positive integer, got {raw!r}")
    return value


@dataclass(frozen=True, slots=True)
class DegradeSettings:
    """One pool's degradation: the policy per class, the threshold and the cap."""

    default: DegradationPolicy = field(default_factory=Off)
    per_class: Mapping[str, DegradationPolicy] = field(default_factory=dict)
    wait_ms: int | None = None  # None: the class's TTFT SLO
    max_tokens: int = DEFAULT_MAX_TOKENS

    @classmethod
    def from_policies(cls, policies: Mapping[str, str]) -> DegradeSettings:
        """Parse the ``degrade*`` keys (others are ignored); raises DegradeSettingsError or
        UnknownPolicyError on a bad value."""
        chosen: dict[str, DegradationPolicy] = {}  # class -> policy; "" = the default
        for item in (policies.get("degrade") or "").split(","):
            if not item.strip():
                continue
            klass, _, name = item.rpartition(":")
            klass = klass.strip()
            if klass in chosen:
                raise DegradeSettingsError(f"degrade names {klass or 'the default'} twice")
            chosen[klass] = degradation_policy(name)
        default = chosen.pop("", None) or Off()
        return cls(
            default=default,
            per_class=chosen,
            wait_ms=_positive(policies, "degrade_wait_ms"),
            max_tokens=_positive(policies, "degrade_max_tokens") or DEFAULT_MAX_TOKENS,
        )

    def policy_for(self, klass: str) -> DegradationPolicy:
        return self.per_class.get(klass, self.default)

    def wait_s(self, ttft_slo_ms: float | None) -> float:
        """The threshold for a class with ``ttft_slo_ms`` (None: no class)."""
        if self.wait_ms is not None:
            return self.wait_ms / 1000.0
        return (ttft_slo_ms or DEFAULT_WAIT_MS) / 1000.0


def degrade_policy_errors(policies: Mapping[str, str]) -> list[str]:
    """What is wrong with the ``degrade*`` keys of ``policies`` (empty when usable)."""
    try:
        DegradeSettings.from_policies(policies)
    except (DegradeSettingsError, UnknownPolicyError) as exc:
        return [f"Degradation: {exc}."]
    return []
