"""The targets a run compares, by name. A name maps to a factory; nothing starts at import."""

from __future__ import annotations

from collections.abc import Callable
from types import MappingProxyType

from bench.targets.bare_proxy import BareProxyTarget
from bench.targets.base import Target, TargetContext, TargetUnavailableError
from bench.targets.direct import DirectTarget
from bench.targets.litellm import LitellmTarget
from bench.targets.switchyard import SwitchyardTarget
from bench.targets.vllm_router import VllmRouterTarget

# bench.preempt_sweep's ``paced`` arm as pool policies (#34): lending with a reserve of 3 slots,
# lent prefills paced at 2,500 tokens/s, a preempted request resuming first
PACED = (("preemption", "fair"), ("lend_reserve", "3"), ("pace_prefill_tps", "2500"),
         ("resume_first", "on"))  # fmt: skip

TRANSPORT = "uvicorn (uvloop, httptools) + the router's lean upstream client, round robin"
# switchyard-chassis: the inference stages a streamed chat request cannot do without (#27)
CHASSIS = ("authenticate", "plan", "admit", "queue", "dispatch", "relay")

FACTORIES: MappingProxyType[str, Callable[[], Target]] = MappingProxyType(
    {
        "direct": lambda: DirectTarget(name="direct"),
        "bare-proxy": lambda: BareProxyTarget(name="bare-proxy"),
        "transport-proxy": lambda: BareProxyTarget(  # the router's transport alone (#27)
            name="transport-proxy", module="bench.transport_proxy", kind=TRANSPORT
        ),
        "switchyard-chassis": lambda: SwitchyardTarget(name="switchyard-chassis", stages=CHASSIS),
        "switchyard-fcfs": lambda: SwitchyardTarget(name="switchyard-fcfs", fairness="fcfs"),
        "switchyard": lambda: SwitchyardTarget(name="switchyard"),
        "switchyard-load-only": lambda: SwitchyardTarget(
            name="switchyard-load-only", prefix_routing="off"
        ),
        "switchyard-preempt": lambda: SwitchyardTarget(  # lend idle slots, take them back (#34)
            name="switchyard-preempt", extra_policies=(("preemption", "fair"),)
        ),
        "switchyard-paced": lambda: SwitchyardTarget(  # lent prefills paced, resumes first
            name="switchyard-paced", extra_policies=PACED
        ),
        "switchyard-home": lambda: SwitchyardTarget(  # paced, and resumes on their endpoint
            name="switchyard-home", extra_policies=(*PACED, ("resume_affinity", "on"))
        ),
        "switchyard-priority": lambda: SwitchyardTarget(  # engine-side priority (#34's rival)
            name="switchyard-priority", extra_policies=(("upstream_priority", "on"),)
        ),
        "switchyard-precise": lambda: SwitchyardTarget(name="switchyard-precise", kv_events=True),
        "switchyard-asgi": lambda: SwitchyardTarget(name="switchyard-asgi", http="asgi"),
        "switchyard-channels": lambda: SwitchyardTarget(
            name="switchyard-channels", http="channels"
        ),
        "switchyard-2w": lambda: SwitchyardTarget(name="switchyard-2w", workers=2),
        "switchyard-tls": lambda: SwitchyardTarget(name="switchyard-tls", tls=True),
        "switchyard-mtls": lambda: SwitchyardTarget(name="switchyard-mtls", tls=True, mtls=True),
        "switchyard-prefix-affinity": lambda: SwitchyardTarget(
            name="switchyard-prefix-affinity", scorers="least_load,prefix_affinity"
        ),
        "vllm-router": lambda: VllmRouterTarget(name="vllm-router"),
        "vllm-router-cache-aware": lambda: VllmRouterTarget(
            name="vllm-router-cache-aware", policy="cache_aware"
        ),
        "litellm": lambda: LitellmTarget(name="litellm"),
    }
)
ALL = tuple(FACTORIES)

__all__ = ["ALL", "CHASSIS", "FACTORIES", "Target", "TargetContext", "TargetUnavailableError"]
