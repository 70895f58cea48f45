"""The narrow bundles of router components that the request path's stages take.

:class:`~runtime.gateway.state.RouterState` owns every component's life (build, start, stop);
a stage gets only the bundle it reads: admission (limits, queues, prices, the routing table),
planning (tokenizer, deadlines, version choice), upstream (client, breakers, retry knobs,
coalescer), safety (compiled policy packs, the classifier, the intervention recorder) or
telemetry (metrics, tracing, the live view, per-version stats, scaling, the request log).
:class:`FleetWatch` holds the background components no stage reads directly (health checks,
in-flight counts, the fleet's signals, the shared fairness counters, the shadow copies' pool):
the state starts and stops them and ``/metrics`` reads them. Each is built once in
``build_state``; none is created or replaced lazily.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field

from runtime.admission.redis_limits import RedisLimits
from runtime.batching.coalescer import Coalescer
from runtime.gateway.config import RouterConfig
from runtime.gateway.interventions import InterventionRecorder
from runtime.gateway.key_usage import KeyUsageRecorder
from runtime.gateway.tokens import TokenCounter
from runtime.metering.pricing import PriceBook
from runtime.routing.inflight import InFlight
from runtime.routing.prefix_placer import PrefixPlacer
from runtime.routing.shadow import ShadowMirror
from runtime.routing.signals import FleetSignals
from runtime.routing.table import RoutingTable
from runtime.safety.classify import Classifier
from runtime.safety.compiled import PackCache
from runtime.scaling.publisher import SignalsPublisher
from runtime.scheduling.pools import Dispatchers
from runtime.scheduling.shared import SharedCounters
from runtime.snapshot import Snapshot
from runtime.telemetry.live import LiveAggregator
from runtime.telemetry.metrics import RouterMetrics
from runtime.telemetry.resume_metrics import ResumeMetrics
from runtime.telemetry.tracing import Tracing
from runtime.telemetry.versions import VersionStats
from runtime.upstream.breaker import BreakerBook
from runtime.upstream.client import UpstreamClient
from runtime.upstream.drain import DrainClient
from runtime.upstream.health import HealthMonitor
from runtime.workers.adapter_loader import AdapterFleet


class PriceHolder:
    """The price book of the snapshot in force (replaced by the snapshot swap callback)."""

    __slots__ = ("book",)

    def __init__(self) -> None:
        self.book: PriceBook | None = None


@dataclass(slots=True, frozen=True, kw_only=True)
class AdmissionDeps:
    """Tenant limits and credits in Redis, the pool queues, prices, the routing table, the
    prefix placer (prefix-aware routing's index)."""

    limits: RedisLimits
    dispatchers: Dispatchers
    table: RoutingTable
    prices: PriceHolder
    metrics: RouterMetrics
    default_band: int
    batch_concurrency: int = 16  # a tenant's batch lane: its lines in flight (the allowance)
    internal_secret: str = ""  # verifies the executor's batch line mark
    prefix: PrefixPlacer = field(default_factory=PrefixPlacer)  # shared with the placements


@dataclass(slots=True, frozen=True, kw_only=True)
class PlanningDeps:
    """What planning reads: the router's deadlines, the tokenizer, version choice's rng."""

    config: RouterConfig
    tokens: TokenCounter
    table: RoutingTable
    rng: random.Random
    key_usage: KeyUsageRecorder


@dataclass(slots=True, frozen=True, kw_only=True)
class UpstreamDeps:
    """Opening upstream: the client, breakers, retry knobs, the unary coalescer."""

    client: UpstreamClient
    breakers: BreakerBook
    rng: random.Random
    retry_attempts: int
    backoff_base_s: float
    backoff_cap_s: float
    coalescer: Coalescer
    coalesce_window_s: float
    tracing: Tracing
    metrics: RouterMetrics
    shadow: ShadowMirror
    adapters: AdapterFleet = field(default_factory=AdapterFleet)  # LoRA residency per replica
    stream_migrations: int = 0  # a broken stream resumes elsewhere at most this often
    resume_metrics: ResumeMetrics | None = None  # None: streams are never migrated
    tokens: TokenCounter | None = None  # a resumed stream's tokens so far (the model's tokenizer)


@dataclass(slots=True, frozen=True, kw_only=True)
class SafetyDeps:
    """The filters' packs compiled per version, the classifier's model calls, the events."""

    packs: PackCache
    classifier: Classifier
    events: InterventionRecorder


@dataclass(slots=True, kw_only=True)
class Telemetry:
    """Where a finished request is accounted: metrics, tracing, live, logs, rollout stats."""

    metrics: RouterMetrics
    tracing: Tracing
    version_stats: VersionStats
    request_log: logging.Logger
    snapshot: Callable[[], Snapshot | None]
    scaling: SignalsPublisher | None = None
    live: LiveAggregator | None = None  # set once by build_state (its sources read the state)


@dataclass(slots=True, frozen=True, kw_only=True)
class FleetWatch:
    """What watches the fleet in the background: health checks, in-flight counts, their
    signals, the fairness counters shared between routers, the shadow copies' own pool."""

    health: HealthMonitor
    inflight: InFlight
    signals: FleetSignals
    shared: SharedCounters
    shadow_client: DrainClient
