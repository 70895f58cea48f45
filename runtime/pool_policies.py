"""Check a pool's ``policies`` against the runtime's registries, where they are written.

A pool's ``policies`` (``PoolSnap.policies``) is a string → string map read by three owners:
scheduling (:mod:`runtime.scheduling.settings`: ``fairness``, ``ordering``, ``saturation``,
``headroom``, ``max_queue``, ``band_shares``, ``preemption``, ``lend_reserve``,
``resume_first``, ``pace_prefill_tps``, ``resume_affinity``, ``resume_hold_ms``,
``lend_max_prefill``, ``lend_exclusive``, ``lend_steer``) and routing
(:mod:`runtime.routing.endpoints`:
``filters``, ``scorers``, ``picker``; :mod:`runtime.gateway.plan`: ``upstream_priority``;
:mod:`runtime.gateway.pipeline.stages.prefix`: ``prefix_routing``, on unless ``off``, and
the sticky rule's ``prefix_stickiness``, ``prefix_min_saved_tokens``, ``prefix_slack_tokens``,
``prefix_max_load``, ``prefix_hold_ms``, ``prefix_hold_min_tokens``:
:mod:`runtime.routing.sticky`) and
degradation (:mod:`runtime.degradation`: ``degrade``, ``degrade_wait_ms``,
``degrade_max_tokens``) and LoRA adapter slots (:mod:`runtime.workers.adapters`:
``max_loras``, ``max_cpu_loras``, read by the launcher and the routers).
The router falls back to the defaults on a bad value (a typo must not take a pool down), so
the control plane calls :func:`pool_policy_errors` before it stores one. A key of a new policy
is one entry in :data:`POOL_POLICY_KEYS`. No Django here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from runtime.degradation import DEGRADE_KEYS, degrade_policy_errors
from runtime.policy_names import UnknownPolicyError
from runtime.routing.endpoints import EndpointSelector
from runtime.routing.sticky import STICKY_POLICY_KEYS, sticky_policy_errors
from runtime.scheduling.settings import PoolSettings, SettingsError
from runtime.workers.adapters import LORA_POLICY_KEYS, LoraSettings

SCHEDULING_KEYS: Final = ("fairness", "ordering", "saturation", "headroom", "max_queue",
                          "band_shares", "preemption", "lend_reserve", "resume_first",
                          "pace_prefill_tps", "resume_affinity", "resume_hold_ms",
                          "lend_max_prefill", "lend_exclusive", "lend_steer")  # fmt: skip
ROUTING_KEYS: Final = ("filters", "scorers", "picker")
UPSTREAM_PRIORITY_VALUES: Final = ("on", "off")
PREFIX_ROUTING_KEY: Final = "prefix_routing"  # on (default) | off
PREFIX_ROUTING_VALUES: Final = ("on", "off")
POOL_POLICY_KEYS: Final = (*SCHEDULING_KEYS, *ROUTING_KEYS, "upstream_priority",
                           PREFIX_ROUTING_KEY, *STICKY_POLICY_KEYS, *DEGRADE_KEYS,
                           *LORA_POLICY_KEYS)  # fmt: skip


def pool_policy_errors(policies: Mapping[str, str]) -> list[str]:
    """What is wrong with ``policies`` (unknown keys, unregistered names, bad parameters);
    an empty list when the router would use them as written."""
    errors: list[str] = []
    unknown = sorted(set(policies) - set(POOL_POLICY_KEYS))
    if unknown:
        errors.append(
            f"Unknown policy key(s): {', '.join(unknown)}. Known: {', '.join(POOL_POLICY_KEYS)}."
        )
    scheduling = {k: v for k, v in policies.items() if k in SCHEDULING_KEYS}
    try:
        PoolSettings.from_policies(scheduling, ()).policies()
    except (SettingsError, UnknownPolicyError) as exc:
        errors.append(f"Scheduling: {exc}.")
    routing = {k: v for k, v in policies.items() if k in ROUTING_KEYS}
    try:
        EndpointSelector.from_policies(routing)
    except UnknownPolicyError as exc:
        errors.append(f"Routing: {exc}.")
    priority = policies.get("upstream_priority")
    if priority is not None and priority not in UPSTREAM_PRIORITY_VALUES:
        errors.append(f"upstream_priority must be 'on' or 'off', got {priority!r}.")
    prefix = policies.get(PREFIX_ROUTING_KEY)
    if prefix is not None and prefix not in PREFIX_ROUTING_VALUES:
        errors.append(f"prefix_routing must be 'on' or 'off', got {prefix!r}.")
    errors.extend(sticky_policy_errors(policies))
    errors.extend(degrade_policy_errors(policies))
    try:
        LoraSettings.from_policies(policies)
    except ValueError as exc:
        errors.append(f"LoRA: {exc}.")
    return errors
