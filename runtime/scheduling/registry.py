"""Every scheduling policy implementation, by interface, looked up by name.

Each interface has exactly one tuple of implementation classes below; a new policy is a class
plus one entry there. The name → class mappings are built from those tuples on lookup
(read-only, nothing is registered by importing a module). A pool's ``policies`` in the
snapshot name the implementations it uses, e.g. ``{"fairness": "vtc", "ordering": "edf",
"saturation": "vllm_metrics"}``; keys of other interfaces (routing's ``filters``, ...) are
left to their owners. :class:`UnknownPolicyError` is the one shared with routing
(:mod:`runtime.policy_names`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final, Literal

from runtime.policy_names import UnknownPolicyError, by_name, lookup
from runtime.scheduling.fairness import FirstComeFirstServed, RoundRobin, VirtualTokenCounter
from runtime.scheduling.interfaces import FairnessPolicy, OrderingPolicy, SaturationDetector
from runtime.scheduling.ordering import ArrivalOrder, EarliestDeadlineFirst
from runtime.scheduling.preempt import FairVictim, FewestGenerated, NoPreemption, VictimPolicy
from runtime.scheduling.saturation import InflightOnly, VllmMetrics

Interface = Literal["fairness", "ordering", "saturation"]

FAIRNESS_POLICIES: Final = (VirtualTokenCounter, FirstComeFirstServed, RoundRobin)
ORDERING_POLICIES: Final = (EarliestDeadlineFirst, ArrivalOrder)
SATURATION_DETECTORS: Final = (VllmMetrics, InflightOnly)
# Preemption's victim choice (:mod:`.preempt`): opt-in (``off`` by default), so kept apart
# from the interfaces above; a pool names one with its ``preemption`` policy key.
PREEMPTION_POLICIES: Final = (FairVictim, FewestGenerated, NoPreemption)

DEFAULTS: Final[Mapping[Interface, str]] = MappingProxyType(
    {"fairness": "vtc", "ordering": "edf", "saturation": "vllm_metrics"}
)


_IMPLEMENTATIONS: Final[Mapping[str, tuple[type[Any], ...]]] = MappingProxyType(
    {
        "fairness": FAIRNESS_POLICIES,
        "ordering": ORDERING_POLICIES,
        "saturation": SATURATION_DETECTORS,
    }
)


def registry(interface: Interface) -> Mapping[str, type[Any]]:
    """The read-only name → class mapping of one interface (built from its tuple)."""
    classes = _IMPLEMENTATIONS.get(interface)
    if classes is None:
        known = ", ".join(sorted(_IMPLEMENTATIONS))
        raise UnknownPolicyError(f"unknown scheduling interface {interface!r} (known: {known})")
    return by_name(interface, classes)


def names(interface: Interface) -> tuple[str, ...]:
    """The registered implementation names of ``interface``, sorted."""
    return tuple(sorted(registry(interface)))


def _lookup(interface: Interface, name: str) -> Any:
    return lookup(f"{interface} policy", registry(interface), name)()


def fairness_policy(name: str) -> FairnessPolicy[Any]:
    """A new instance (default settings) of the fairness policy called ``name``."""
    policy: FairnessPolicy[Any] = _lookup("fairness", name)
    return policy


def ordering_policy(name: str) -> OrderingPolicy:
    """A new instance of the ordering policy called ``name``."""
    policy: OrderingPolicy = _lookup("ordering", name)
    return policy


def saturation_detector(name: str) -> SaturationDetector:
    """A new instance (default settings) of the saturation detector called ``name``."""
    detector: SaturationDetector = _lookup("saturation", name)
    return detector


def preemption_names() -> tuple[str, ...]:
    """The registered victim-choice policies' names, sorted."""
    return tuple(sorted(by_name("preemption", PREEMPTION_POLICIES)))


def preemption_policy(name: str) -> VictimPolicy:
    """A new instance of the preemption (victim choice) policy called ``name``."""
    policy: VictimPolicy = lookup(
        "preemption policy", by_name("preemption", PREEMPTION_POLICIES), name
    )()
    return policy


@dataclass(frozen=True, slots=True)
class PoolPolicies:
    """The scheduling policies one pool uses."""

    fairness: FairnessPolicy[Any]
    ordering: OrderingPolicy
    saturation: SaturationDetector
    preemption: VictimPolicy

    @classmethod
    def from_policies(cls, policies: Mapping[str, str]) -> PoolPolicies:
        """Resolve a pool's snapshot ``policies``; missing keys take :data:`DEFAULTS`.

        Raises :class:`UnknownPolicyError` for a name that is not registered.
        """
        return cls(
            fairness=fairness_policy(policies.get("fairness", DEFAULTS["fairness"])),
            ordering=ordering_policy(policies.get("ordering", DEFAULTS["ordering"])),
            saturation=saturation_detector(policies.get("saturation", DEFAULTS["saturation"])),
            preemption=preemption_policy(policies.get("preemption", "off")),
        )
