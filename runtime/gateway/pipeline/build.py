"""The inference stage list, in order. Adding a stage is one module under ``stages/`` plus
one line here.

``authenticate`` -> ``batch_line`` (the executor's signed mark: the batch lane) -> ``plan`` ->
``degrade`` (cap or fall back, per the pool's policy) ->
``prefilter`` (refuse or redact; no pack: nothing) -> ``postfilter`` (the output screen the
relay and replays apply) -> ``idempotency`` (replay, or detach) -> ``admit`` (registers
``settle``) -> ``mirror`` -> ``cache`` (a hit answers) -> ``prefix`` (an LLM prompt's block
hashes, for prefix-aware placement) -> ``queue`` (registers the grant's release) -> ``adapter``
(a LoRA adapter made resident on the granted replica) -> ``dispatch`` (a coalesced unary
request answers) -> ``prefix_started`` (its prefill is no longer queued) -> ``migrate`` (a
stream that breaks goes on elsewhere) -> ``relay``; then
the context's exit stack runs the releases, and the consumer runs ``account``.
"""

from __future__ import annotations

from collections.abc import Callable

from runtime.gateway.bundles import AdmissionDeps, PlanningDeps, SafetyDeps, UpstreamDeps
from runtime.gateway.cache_front import CacheFront
from runtime.gateway.pipeline.stage import Stage
from runtime.gateway.pipeline.stages.adapter import AdapterResidency
from runtime.gateway.pipeline.stages.admit import Admit
from runtime.gateway.pipeline.stages.authenticate import Authenticate
from runtime.gateway.pipeline.stages.batch_line import BatchLineMark
from runtime.gateway.pipeline.stages.cache import CacheBegin, CacheLookup
from runtime.gateway.pipeline.stages.degrade import Degrade
from runtime.gateway.pipeline.stages.dispatch import Dispatch
from runtime.gateway.pipeline.stages.migrate import Migrate
from runtime.gateway.pipeline.stages.mirror import Mirror
from runtime.gateway.pipeline.stages.plan import PlanStage
from runtime.gateway.pipeline.stages.postfilter import Postfilter
from runtime.gateway.pipeline.stages.prefilter import Prefilter
from runtime.gateway.pipeline.stages.prefix import PrefixBlocks, PrefixStarted
from runtime.gateway.pipeline.stages.queue import Queue
from runtime.gateway.pipeline.stages.relay import Relay
from runtime.snapshot import Snapshot


def inference_stages(
    *,
    snapshot: Callable[[], Snapshot | None],
    planning: PlanningDeps,
    admission: AdmissionDeps,
    upstream: UpstreamDeps,
    cache: CacheFront,
    safety: SafetyDeps,
) -> list[Stage]:
    return [
        Authenticate(snapshot, planning.key_usage),
        BatchLineMark(admission),
        PlanStage(planning),
        Degrade(planning, admission, upstream.breakers),
        Prefilter(safety),
        Postfilter(safety),
        CacheBegin(cache),
        Admit(admission),
        Mirror(upstream.shadow),
        CacheLookup(cache, admission),
        PrefixBlocks(admission),
        Queue(admission),
        AdapterResidency(upstream),
        Dispatch(upstream),
        PrefixStarted(admission),
        Migrate(upstream),
        Relay(upstream.metrics),
    ]
