"""Endpoint choice: named filters, scorers and a picker, chosen per pool.

A pool's ``policies`` (from the snapshot) may name them:

- ``"filters"``: comma-separated filter names (default ``ready,circuit,health``);
- ``"scorers"``: comma-separated ``name[:weight]`` (default ``least_load``); scores are in
  ``[0, 1]`` (higher is better) and combine as a weighted mean. Registered: ``least_load``
  (in-flight over capacity), ``kv_use`` (scraped KV-cache use), ``prefix_affinity``
  (rendezvous hash of the prompt prefix), ``prefix_cache`` (the share of the prompt's blocks
  the endpoint is believed to hold, :mod:`runtime.routing.prefix_index`), ``cost_tier`` (the
  pool's replica cost), ``adapter_residency`` (a LoRA adapter resident unless saturated, else
  least load plus load time, :mod:`runtime.routing.adapters`; 0.5 for a request without an
  adapter, so the default ``least_load,adapter_residency:10`` ranks full models by load);
- ``"picker"``: one picker name (default ``max_score``).

Unknown names raise :class:`UnknownPolicyError` (the one scheduling uses too) when the selector
is built. As in :mod:`runtime.scheduling.registry`, each interface has one tuple of classes
with a ``name`` (:data:`FILTERS`, :data:`SCORERS`, :data:`PICKERS`) and :func:`registry` looks
them up by name; a new policy is a class plus one entry there. Signals (breakers, health,
in-flight counts, KV use) come from the caller through :class:`EndpointSignals`.
"""

from __future__ import annotations

import hashlib
import itertools
import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any, Final, Literal, Protocol

from runtime.policy_names import UnknownPolicyError, by_name, lookup
from runtime.routing.adapters import AdapterResidencyScorer, AdapterSignal
from runtime.snapshot import EndpointSnap


class EndpointSignals(Protocol):
    """What routing may know about an endpoint (and the request being placed) right now."""

    def breaker_available(self, endpoint_id: int) -> bool: ...

    def healthy(self, endpoint_id: int) -> bool: ...

    def inflight(self, endpoint_id: int) -> int: ...

    def kv_usage(self, endpoint_id: int) -> float | None:
        """The engine's KV-cache use (0..1) from the last fresh scrape; None if unknown."""
        ...

    def cost_per_hour(self, endpoint: EndpointSnap) -> float | None:
        """What a replica of the endpoint's pool costs per hour; None if unknown."""
        ...

    def affinity_key(self) -> str | None:
        """A hash of the request's prompt prefix (prefix affinity); None if none."""
        ...

    def cached_prefix(self, endpoint_id: int) -> float | None:
        """The share (0..1) of the request's prompt blocks the endpoint is believed to hold
        in its prefix cache; None when the request carries no prefix match."""
        ...

    def adapter(self, endpoint_id: int) -> AdapterSignal | None:
        """The LoRA adapter the request names, as the endpoint holds it; None when the
        request names no adapter."""
        ...


class EndpointFilter(Protocol):
    name: str

    def keep(self, endpoint: EndpointSnap, signals: EndpointSignals) -> bool: ...


class Scorer(Protocol):
    name: str

    def score(self, endpoint: EndpointSnap, signals: EndpointSignals) -> float: ...


class Picker(Protocol):
    name: str

    def pick(self, scored: Sequence[tuple[EndpointSnap, float]]) -> EndpointSnap: ...


class ReadyFilter:
    """Only endpoints the control plane marked ``ready`` (not starting, not draining)."""

    name = "ready"

    def keep(self, endpoint: EndpointSnap, signals: EndpointSignals) -> bool:
        return endpoint.state == "ready"


class CircuitFilter:
    """Not while the endpoint's circuit breaker would refuse the request."""

    name = "circuit"

    def keep(self, endpoint: EndpointSnap, signals: EndpointSignals) -> bool:
        return signals.breaker_available(endpoint.id)


class HealthFilter:
    """Not while the health monitor says the endpoint is down."""

    name = "health"

    def keep(self, endpoint: EndpointSnap, signals: EndpointSignals) -> bool:
        return signals.healthy(endpoint.id)


class LeastLoadScorer:
    """1 for an idle endpoint, 0 at (or beyond) its capacity: ``1 - in_flight / capacity``."""

    name = "least_load"

    def score(self, endpoint: EndpointSnap, signals: EndpointSignals) -> float:
        capacity = max(endpoint.capacity, 1)
        return max(0.0, 1.0 - signals.inflight(endpoint.id) / capacity)


class KvUseScorer:
    """1 for an empty KV cache, 0 for a full one: ``1 - kv_usage``; 0.5 when unknown."""

    name = "kv_use"

    def score(self, endpoint: EndpointSnap, signals: EndpointSignals) -> float:
        usage = signals.kv_usage(endpoint.id)
        if usage is None or not math.isfinite(usage):
            return 0.5
        return min(1.0, max(0.0, 1.0 - usage))


class PrefixAffinityScorer:
    """Rendezvous hashing of the prompt-prefix key with the endpoint id: a uniform score in
    ``[0, 1)`` that is the same on every router for the same key and endpoint, so requests
    sharing a prompt prefix prefer the same endpoint (its prefix cache is warm) and an
    endpoint joining or leaving moves only the keys it wins or held. 0.5 without a key."""

    name = "prefix_affinity"

    def score(self, endpoint: EndpointSnap, signals: EndpointSignals) -> float:
        key = signals.affinity_key()
        if key is None:
            return 0.5
        digest = hashlib.blake2b(f"{key}\0{endpoint.id}".encode(), digest_size=8).digest()
        return int.from_bytes(digest, "big") / 2.0**64


class PrefixCacheScorer:
    """The longest cached prefix: the share of the request's full prompt blocks the endpoint
    holds (``PrefixMatch.fraction``: 1 when it holds them all, 0 when none); 0.5 for every
    endpoint when the request carries no match (no prompt blocks, or nothing indexed yet)."""

    name = "prefix_cache"

    def score(self, endpoint: EndpointSnap, signals: EndpointSignals) -> float:
        share = signals.cached_prefix(endpoint.id)
        if share is None or not math.isfinite(share):
            return 0.5
        return min(1.0, max(0.0, share))


class CostTierScorer:
    """Cheaper hardware first: ``1 / (1 + cost_per_hour)`` of the endpoint's pool (1 for a
    free pool, 0.5 at one credit per hour); 0.5 when the cost is unknown."""

    name = "cost_tier"

    def score(self, endpoint: EndpointSnap, signals: EndpointSignals) -> float:
        cost = signals.cost_per_hour(endpoint)
        if cost is None or not math.isfinite(cost) or cost < 0:
            return 0.5
        return 1.0 / (1.0 + cost)


class MaxScorePicker:
    """The best score; ties go round-robin so equally idle endpoints share the load."""

    name = "max_score"

    def __init__(self) -> None:
        self._turn = itertools.count()

    def pick(self, scored: Sequence[tuple[EndpointSnap, float]]) -> EndpointSnap:
        best = max(score for _, score in scored)
        tied = [endpoint for endpoint, score in scored if score >= best - 1e-9]
        return tied[next(self._turn) % len(tied)]


FILTERS: Final = (ReadyFilter, CircuitFilter, HealthFilter)
SCORERS: Final = (
    LeastLoadScorer,
    KvUseScorer,
    PrefixAffinityScorer,
    PrefixCacheScorer,
    CostTierScorer,
    AdapterResidencyScorer,
)
PICKERS: Final = (MaxScorePicker,)
DEFAULT_FILTERS: Final = "ready,circuit,health"
DEFAULT_SCORERS: Final = "least_load,adapter_residency:10"
DEFAULT_PICKER: Final = "max_score"

Interface = Literal["filters", "scorers", "picker"]
_IMPLEMENTATIONS: Final[Mapping[str, tuple[type[Any], ...]]] = MappingProxyType(
    {"filters": FILTERS, "scorers": SCORERS, "picker": PICKERS}
)
_KIND: Final[Mapping[str, str]] = MappingProxyType(
    {"filters": "filter", "scorers": "scorer", "picker": "picker"}
)


def registry(interface: Interface) -> Mapping[str, type[Any]]:
    """The read-only name → class mapping of one routing interface (built from its tuple)."""
    classes = _IMPLEMENTATIONS.get(interface)
    if classes is None:
        known = ", ".join(sorted(_IMPLEMENTATIONS))
        raise UnknownPolicyError(f"unknown routing interface {interface!r} (known: {known})")
    return by_name(_KIND[interface], classes)


def names(interface: Interface) -> tuple[str, ...]:
    """The registered implementation names of ``interface``, sorted."""
    return tuple(sorted(registry(interface)))


def _names(spec: str) -> list[str]:
    return [part.strip() for part in spec.split(",") if part.strip()]


def _new(interface: Interface, name: str) -> Any:
    return lookup(_KIND[interface], registry(interface), name)()


def parse_scorer(item: str) -> tuple[str, float]:
    """``"name[:weight]"`` → (name, weight); a weight that is not a positive number raises."""
    name, _, weight = item.partition(":")
    try:
        value = float(weight) if weight else 1.0
    except ValueError:
        raise UnknownPolicyError(f"bad scorer weight in {item!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise UnknownPolicyError(f"scorer weight must be a positive number in {item!r}")
    return name.strip(), value


class EndpointSelector:
    """Filters, then scores, then picks. One instance per pool policy set (it keeps turns)."""

    __slots__ = ("filters", "picker", "scorers")

    def __init__(
        self,
        *,
        filters: Sequence[EndpointFilter],
        scorers: Sequence[tuple[Scorer, float]],
        picker: Picker,
    ) -> None:
        if not scorers or any(weight <= 0 for _, weight in scorers):
            raise UnknownPolicyError("at least one scorer with a positive weight is needed")
        self.filters = tuple(filters)
        self.scorers = tuple(scorers)
        self.picker = picker

    @classmethod
    def from_policies(cls, policies: Mapping[str, str]) -> EndpointSelector:
        """The selector a pool's ``policies`` name; :class:`UnknownPolicyError` if any is bad."""
        filters = [
            _new("filters", name) for name in _names(policies.get("filters", DEFAULT_FILTERS))
        ]
        scorers: list[tuple[Scorer, float]] = []
        for item in _names(policies.get("scorers", DEFAULT_SCORERS)):
            name, weight = parse_scorer(item)
            scorers.append((_new("scorers", name), weight))
        picker: Picker = _new("picker", policies.get("picker", DEFAULT_PICKER))
        return cls(filters=filters, scorers=scorers, picker=picker)

    def eligible(
        self,
        endpoints: Sequence[EndpointSnap],
        signals: EndpointSignals,
        exclude: frozenset[int] | set[int] = frozenset(),
    ) -> list[EndpointSnap]:
        return [
            e
            for e in endpoints
            if e.id not in exclude and all(f.keep(e, signals) for f in self.filters)
        ]

    def score(self, endpoint: EndpointSnap, signals: EndpointSignals) -> float:
        total_weight = sum(weight for _, weight in self.scorers)
        weighted = sum(s.score(endpoint, signals) * w for s, w in self.scorers)
        return weighted / total_weight

    def select(
        self,
        endpoints: Sequence[EndpointSnap],
        signals: EndpointSignals,
        exclude: frozenset[int] | set[int] = frozenset(),
    ) -> EndpointSnap | None:
        """The endpoint to use, or None when no endpoint passes the filters."""
        eligible = self.eligible(endpoints, signals, exclude)
        if not eligible:
            return None
        return self.picker.pick([(e, self.score(e, signals)) for e in eligible])
