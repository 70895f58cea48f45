"""Everything a router process holds, in one object built by the ASGI lifespan.

uvicorn copies the lifespan ``state`` dict into every request scope, so consumers find this
object at ``scope["state"][STATE_KEY]``; nothing lives in module globals. The state owns the
components' life (build, start, stop); the request path sees only the narrow bundles of
:mod:`runtime.gateway.bundles` (admission, planning, upstream, telemetry), the cache front and
the inference :class:`~runtime.gateway.pipeline.stage.Pipeline`, all made by
:func:`build_state`: nothing is created on first use.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass, field

from runtime.admission.redis_limits import RedisLimits
from runtime.cache.metrics import CacheMetrics
from runtime.contract import usage_stream
from runtime.gateway.adapter_heartbeats import AdapterHeartbeats
from runtime.gateway.bundles import (
    AdmissionDeps,
    FleetWatch,
    PlanningDeps,
    PriceHolder,
    SafetyDeps,
    Telemetry,
    UpstreamDeps,
)
from runtime.gateway.cache_front import CacheFront
from runtime.gateway.config import RouterConfig, at_rest_keyring
from runtime.gateway.interventions import InterventionRecorder
from runtime.gateway.key_usage import KeyUsageRecorder
from runtime.gateway.live_view import live_sources
from runtime.gateway.pipeline.build import inference_stages
from runtime.gateway.pipeline.stage import Pipeline
from runtime.gateway.pipeline.stages.account import Account
from runtime.gateway.request_ids import RequestIds
from runtime.gateway.safety_classifier import UpstreamClassifier
from runtime.gateway.tokens import TokenCounter
from runtime.gateway.unary import make_coalescer
from runtime.metering.pricing import PriceBook
from runtime.routing.inflight import InFlight
from runtime.routing.kv_index import EventedPrefixIndex
from runtime.routing.kv_subscriber import KvEventSubscribers, snapshot_addresses
from runtime.routing.prefix_placer import PrefixPlacer
from runtime.routing.shadow import ShadowMirror
from runtime.routing.signals import FleetSignals
from runtime.routing.table import RoutingTable
from runtime.safety.compiled import PackCache
from runtime.scaling.engines import EngineScraper
from runtime.scaling.fleet import SnapshotFleet
from runtime.scaling.publisher import PoolMeter, SignalsPublisher
from runtime.scheduling.placement import FleetPlacement
from runtime.scheduling.pools import Dispatchers
from runtime.scheduling.shared import SharedCounters
from runtime.snapshot import Snapshot
from runtime.snapshot_loader import SnapshotLoader, SnapshotUnavailableError
from runtime.telemetry.collectors import EndpointView
from runtime.telemetry.live import LiveAggregator
from runtime.telemetry.logging import REQUEST_LOGGER
from runtime.telemetry.loop_lag import LoopLagProbe
from runtime.telemetry.metrics import PoolView, RouterMetrics
from runtime.telemetry.resume_metrics import ResumeMetrics
from runtime.telemetry.tracing import Tracing
from runtime.telemetry.versions import VersionStats
from runtime.upstream.breaker import BreakerBook, BreakerState
from runtime.upstream.choice import new_client
from runtime.upstream.client import ClientConfig, UpstreamClient
from runtime.upstream.control import ControlPlaneClient
from runtime.upstream.drain import DrainClient
from runtime.upstream.health import HealthConfig, HealthMonitor
from runtime.upstream.timeouts import TimeoutPolicy
from runtime.workers.adapter_loader import AdapterFleet

STATE_KEY = "switchyard"
SHADOW_INFLIGHT = 4  # shadow copies in flight at once (more are dropped)
SHADOW_TIMEOUT_S = 60.0  # a shadow copy is read to its end within this

logger = logging.getLogger(__name__)


@dataclass(slots=True, kw_only=True)
class RouterState:
    """The router's components, held in the bundles the request path takes (no component is
    held twice): start/stop and ``/metrics`` reach them through the bundles too."""

    config: RouterConfig
    loader: SnapshotLoader
    admission: AdmissionDeps  # limits, dispatchers, routing table, prices
    planning: PlanningDeps  # tokenizer, key usage, rng
    upstream: UpstreamDeps  # client, breakers, coalescer, shadow mirror
    safety: SafetyDeps  # packs, classifier, the intervention recorder
    telemetry: Telemetry  # metrics, tracing, version stats, scaling, live view, request log
    fleet: FleetWatch  # health, in-flight counts, signals, shared counters, shadow pool
    cache: CacheFront  # the response cache and idempotency records (runtime/cache)
    pipeline: Pipeline
    account: Account
    request_ids: RequestIds = field(default_factory=RequestIds)  # fresh X-Request-Id values
    snapshot_task: asyncio.Task[None] | None = None
    loop_lag: LoopLagProbe | None = None  # the event loop's lag histogram (issue #14)
    adapter_heartbeats: AdapterHeartbeats | None = None  # LoRA residency from heartbeats
    control: ControlPlaneClient | None = None  # the Batch API's files and batches (forwarded)
    kv_events: KvEventSubscribers | None = None  # engines' KV events -> the prefix index

    # Read-only views of single components (tests and the routes read these); each lives
    # in exactly one bundle.
    @property
    def limits(self) -> RedisLimits:
        return self.admission.limits

    @property
    def client(self) -> UpstreamClient:
        return self.upstream.client

    @property
    def breakers(self) -> BreakerBook:
        return self.upstream.breakers

    @property
    def health(self) -> HealthMonitor:
        return self.fleet.health

    @property
    def metrics(self) -> RouterMetrics:
        return self.telemetry.metrics

    @property
    def tracing(self) -> Tracing:
        return self.telemetry.tracing

    @property
    def key_usage(self) -> KeyUsageRecorder:
        return self.planning.key_usage

    @property
    def prices(self) -> PriceBook | None:
        """The snapshot's price book (credits, issue #11), rebuilt on every swap."""
        return self.admission.prices.book

    @property
    def snapshot(self) -> Snapshot | None:
        """The snapshot in force, or None before the first one loaded."""
        if self.loader.version is None:
            return None
        return self.loader.current

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """Swap callback: watch exactly the snapshot's endpoints, forget the rest."""
        self.fleet.health.set_endpoints(snapshot.endpoints.values())
        self.upstream.breakers.retain(snapshot.endpoints)
        self.admission.prefix.retain(snapshot.endpoints)
        self.admission.dispatchers.on_snapshot(snapshot)
        self.admission.prices.book = PriceBook(snapshot)
        if self.kv_events is not None:
            self.kv_events.sync(snapshot_addresses(snapshot))

    def pool_views(self) -> list[PoolView]:
        """What the dispatchers report to ``/metrics`` (read at scrape time)."""
        dispatchers = self.admission.dispatchers.all()
        if not dispatchers:
            return []
        now = asyncio.get_running_loop().time()
        views: list[PoolView] = []
        for dispatcher in dispatchers:
            fairness = dispatcher.served.fairness(now)
            gate = dispatcher.held_back()
            views.append(
                PoolView(
                    pool=dispatcher.pool,
                    queued=dispatcher.queue_lengths(),
                    served_tokens=dispatcher.served.totals(),
                    served_share=fairness.served_share,
                    entitled_share=fairness.entitled_share,
                    counters=dispatcher.counters(),
                    jain=fairness.jain,
                    over=gate.tenants,
                    over_limit=gate.limit,
                    flooding=gate.flooders,
                    flood_limit=gate.flood_limit,
                )
            )
        return views

    def endpoint_views(self) -> list[EndpointView]:
        """What health checks and breakers say of each endpoint (``/metrics``, scrape time)."""
        snapshot = self.snapshot
        if snapshot is None:
            return []
        breakers = self.upstream.breakers.states()
        fleet = self.fleet
        views: list[EndpointView] = []
        for endpoint in snapshot.endpoints.values():
            status = fleet.health.status(endpoint.id)
            views.append(
                EndpointView(
                    endpoint=endpoint.id,
                    pool=endpoint.pool,
                    up=fleet.signals.healthy(endpoint.id),
                    breaker_open=breakers.get(endpoint.id) is BreakerState.OPEN,
                    kv_usage=None if status is None else status.kv_usage,
                    waiting=None if status is None else status.waiting,
                )
            )
        return views

    async def start(self) -> None:
        """Start the background work; a missing snapshot is retried, not fatal (not ready)."""
        if self.loop_lag is not None:
            self.loop_lag.start()
        telemetry = self.telemetry
        await self.planning.key_usage.start()
        await self.safety.events.start()
        await telemetry.version_stats.start()
        await self.upstream.shadow.start()
        await self.admission.limits.start()
        await self.fleet.shared.start()
        await self.fleet.health.start()
        if self.adapter_heartbeats is not None:
            self.adapter_heartbeats.start()
        self.cache.start()
        if telemetry.scaling is not None:
            telemetry.scaling.start()
        if telemetry.live is not None:
            await telemetry.live.start()
        try:
            await self.loader.start()
        except SnapshotUnavailableError as exc:
            logger.warning("router: no snapshot yet (%s); not ready, retrying", exc)
            self.snapshot_task = asyncio.create_task(
                self._load_snapshot_until_ready(), name="snapshot-initial-load"
            )

    async def _load_snapshot_until_ready(self) -> None:
        delay = self.config.snapshot_retry_s
        while True:
            await asyncio.sleep(delay)
            try:
                await self.loader.start()
            except SnapshotUnavailableError as exc:
                logger.debug("router: still no snapshot: %s", exc)
                delay = min(delay * 2, self.config.snapshot_retry_max_s)
                continue
            logger.info("router: snapshot %s loaded; ready", self.loader.version)
            return

    async def stop(self) -> None:
        """Stop everything :meth:`start` started (in-flight requests are already done)."""
        task, self.snapshot_task = self.snapshot_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        telemetry = self.telemetry
        await self.loader.stop()
        if self.kv_events is not None:
            await self.kv_events.close()
        if telemetry.scaling is not None:
            await telemetry.scaling.stop()
        if telemetry.live is not None:
            await telemetry.live.stop()
        await self.admission.dispatchers.stop()
        await self.fleet.health.stop()
        if self.adapter_heartbeats is not None:
            await self.adapter_heartbeats.stop()
        await self.fleet.shared.stop()
        await self.admission.limits.stop()
        await self.planning.key_usage.stop()
        await self.safety.events.stop()
        await self.upstream.shadow.stop()
        await self.fleet.shadow_client.close()
        await telemetry.version_stats.stop()
        await self.cache.close()
        await self.upstream.client.close()
        if self.control is not None:
            await self.control.close()
        if self.loop_lag is not None:
            await self.loop_lag.stop()
        telemetry.tracing.shutdown()


def build_state(config: RouterConfig) -> RouterState:
    """Create (not start) every component from ``config``."""
    tls = None if config.upstream_tls is None else config.upstream_tls.context()
    client = new_client(
        config.upstream_client,
        ClientConfig(
            timeouts=TimeoutPolicy(
                connect_cap=config.connect_timeout_s, first_byte_cap=config.ttft_timeout_s
            ),
            tls=tls,
        ),
    )
    health = HealthMonitor(client, HealthConfig(interval_s=config.health_interval_s))
    breakers = BreakerBook(on_success=health.note_success)  # real successes: passive health
    inflight = InFlight()
    loader = SnapshotLoader(
        config.redis_url,
        config.snapshot_cache_path,
        prefix=config.snapshot_prefix,
        stale_after_s=config.snapshot_stale_after_s,
        confirm_poll_s=config.snapshot_confirm_poll_s,
    )
    table = RoutingTable()
    signals = FleetSignals(breakers=breakers, health=health, inflight=inflight)
    metrics = RouterMetrics(max_tenant_labels=config.max_tenant_labels)
    shared = SharedCounters(
        config.redis_url, prefix=config.fairness_keys, interval_s=config.fairness_sync_s
    )

    current = loader.loaded  # the snapshot in force or None: one call per read (#27)

    adapters = AdapterFleet()  # LoRA residency: placement reads it, the adapter stage loads
    # One per process (endpoint ids are unique across pools); precise where engines publish
    # KV events (runtime/routing/kv_index.py), fed by one subscriber per endpoint.
    evented = EventedPrefixIndex()
    prefix = PrefixPlacer(index=evented)

    def placement_for(pool: str) -> FleetPlacement:
        return FleetPlacement(
            pool,
            snapshot=current,
            table=table,
            signals=signals,
            health=health,
            inflight=inflight,
            clock=_loop_time,
            on_slot=metrics.inflight_delta,
            residency=adapters,
            prefix=prefix,
        )

    version_stats = VersionStats(config.redis_url, namespace=config.namespace)
    limits = RedisLimits(
        config.redis_url,
        prefix=config.limits_keys,
        usage_stream=usage_stream(config.namespace),
        spool_dir=config.snapshot_cache_path.parent / "usage-spool",
        replicas=config.limit_processes,  # routers x workers: the Redis-down share
        lease_ttl_s=config.lease_ttl_s,
        settle_linger_s=config.settle_linger_s,
    )
    dispatchers = Dispatchers(
        placement_for=placement_for,
        tick_s=config.dispatch_tick_s,
        default_queue_limit=config.default_queue_limit,
        headroom_window_s=config.headroom_window_s,
        shared=shared,
        cold_start=lambda version: cold_start_s(current(), version),
    )
    key_usage = KeyUsageRecorder(
        config.redis_url, hash_key=config.key_usage_hash, interval_s=config.key_usage_flush_s
    )
    tokens = TokenCounter(cache_size=config.tokenizer_cache_size)
    tracing = Tracing.from_env()
    shadow_client = DrainClient(timeout_s=SHADOW_TIMEOUT_S, limit=SHADOW_INFLIGHT, tls=tls)
    shadow = ShadowMirror(
        stats=version_stats, max_inflight=SHADOW_INFLIGHT, timeout_s=SHADOW_TIMEOUT_S,
        client=shadow_client,
    )  # fmt: skip
    rng = random.Random()  # noqa: S311 - load spreading, not secrets
    request_log = logging.getLogger(REQUEST_LOGGER)
    coalescer = make_coalescer(client, config.coalesce_window_s)
    cache = CacheFront(config.redis_url, namespace=config.namespace,
                       metrics=CacheMetrics(metrics.registry),
                       keyring=at_rest_keyring(config))  # fmt: skip
    scaling = SignalsPublisher(
        config.redis_url,
        namespace=config.namespace,
        pools=dispatchers.all,
        meter=PoolMeter(
            SnapshotFleet(current, signals), engines=EngineScraper(current, client=client)
        ),
        interval_s=config.scaling_signals_s,
    )
    admission = AdmissionDeps(prefix=prefix, limits=limits, dispatchers=dispatchers, table=table,
                              prices=PriceHolder(), metrics=metrics,
                              default_band=config.default_band,
                              batch_concurrency=config.batch_concurrency,
                              internal_secret=config.internal_secret)  # fmt: skip
    planning = PlanningDeps(config=config, tokens=tokens, table=table, rng=rng,
                            key_usage=key_usage)  # fmt: skip
    upstream = UpstreamDeps(
        client=client, breakers=breakers, rng=rng, retry_attempts=config.retry_attempts,
        backoff_base_s=config.retry_backoff_base_s, backoff_cap_s=config.retry_backoff_cap_s,
        coalescer=coalescer, coalesce_window_s=config.coalesce_window_s, tracing=tracing,
        metrics=metrics, shadow=shadow, adapters=adapters,
        stream_migrations=config.stream_migrations, resume_metrics=ResumeMetrics(metrics.registry),
        tokens=tokens,
    )  # fmt: skip
    telemetry = Telemetry(metrics=metrics, tracing=tracing, version_stats=version_stats,
                          request_log=request_log, snapshot=current, scaling=scaling)  # fmt: skip
    interventions = InterventionRecorder(config.redis_url, namespace=config.namespace,
                                         registry=metrics.registry)  # fmt: skip
    safety = SafetyDeps(packs=PackCache(), classifier=UpstreamClassifier(client, current),
                        events=interventions)  # fmt: skip
    stages = inference_stages(
        snapshot=current, planning=planning, admission=admission, upstream=upstream, cache=cache,
        safety=safety,
    )  # fmt: skip
    fleet = FleetWatch(health=health, inflight=inflight, signals=signals, shared=shared,
                       shadow_client=shadow_client)  # fmt: skip
    state = RouterState(
        config=config,
        loader=loader,
        admission=admission,
        planning=planning,
        upstream=upstream,
        safety=safety,
        telemetry=telemetry,
        fleet=fleet,
        cache=cache,
        pipeline=Pipeline(stages),
        account=Account(telemetry),
        control=ControlPlaneClient(config.control_plane_url) if config.control_plane_url else None,
    )
    state.loop_lag = LoopLagProbe(metrics.registry)
    state.kv_events = KvEventSubscribers(evented.tracker)
    state.loader.add_swap_callback(state.on_snapshot)
    metrics.attach_scheduling(state.pool_views)
    metrics.attach_snapshot(loader)
    metrics.attach_fleet(state.endpoint_views)
    metrics.attach_admission(lambda: limits.degraded)
    metrics.attach_adapters(adapters.rows)
    state.adapter_heartbeats = AdapterHeartbeats(
        config.redis_url, adapters, current, after_poll=metrics.sync_adapters
    )
    telemetry.live = LiveAggregator(config.redis_url, config.namespace, live_sources(state))
    return state


def cold_start_s(snapshot: Snapshot | None, version_id: int) -> float | None:
    """The expected start time of a version that its pool scales from zero; None if not."""
    version = None if snapshot is None else snapshot.versions.get(version_id)
    if version is None or not version.scale_pool:
        return None
    return version.cold_start_s


def _loop_time() -> float:
    return asyncio.get_running_loop().time()
