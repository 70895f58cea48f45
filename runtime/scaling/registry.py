"""Every scaling policy, looked up by name (the shape of :mod:`runtime.scheduling.registry`).

A pool's policy defaults from its hardware tier: ``cpu`` pools scale with ``cpu``, every other
tier with ``gpu`` (:func:`policy_for_tier`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from runtime.policy_names import by_name, lookup
from runtime.scaling.policies import CpuPolicy, GpuPolicy, ScalingPolicy

SCALING_POLICIES: Final = (GpuPolicy, CpuPolicy)


def registry() -> Mapping[str, type[Any]]:
    return by_name("scaling", SCALING_POLICIES)


def names() -> tuple[str, ...]:
    return tuple(sorted(registry()))


def scaling_policy(name: str) -> ScalingPolicy:
    """A new instance of the policy registered as ``name`` (UnknownPolicyError otherwise)."""
    policy: ScalingPolicy = lookup("scaling policy", registry(), name)()
    return policy


def policy_for_tier(hardware_tier: str) -> str:
    return "cpu" if hardware_tier.strip().lower() == "cpu" else "gpu"
