"""Everything a router process holds, in one object built by the ASGI lifespan.

uvicorn copies the lifespan ``state`` dict into every request scope, so consumers find this
object at ``scope["state"][STATE_KEY]``; nothing lives in module globals.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass, field

from runtime.gateway.config import RouterConfig
from runtime.gateway.key_usage import KeyUsageRecorder
from runtime.gateway.tokens import TokenCounter
from runtime.routing.inflight import InFlight
from runtime.routing.signals import FleetSignals
from runtime.routing.table import RoutingTable
from runtime.snapshot import Snapshot
from runtime.snapshot_loader import SnapshotLoader, SnapshotUnavailableError
from runtime.telemetry.logging import REQUEST_LOGGER
from runtime.telemetry.metrics import RouterMetrics
from runtime.upstream.breaker import BreakerBook
from runtime.upstream.client import ClientConfig, UpstreamClient
from runtime.upstream.health import HealthConfig, HealthMonitor
from runtime.upstream.timeouts import TimeoutPolicy

STATE_KEY = "switchyard"

logger = logging.getLogger(__name__)


@dataclass(slots=True, kw_only=True)
class RouterState:
    config: RouterConfig
    loader: SnapshotLoader
    client: UpstreamClient
    breakers: BreakerBook
    health: HealthMonitor
    inflight: InFlight
    table: RoutingTable
    signals: FleetSignals
    metrics: RouterMetrics
    key_usage: KeyUsageRecorder
    tokens: TokenCounter
    rng: random.Random = field(default_factory=random.Random)
    request_log: logging.Logger = field(default_factory=lambda: logging.getLogger(REQUEST_LOGGER))
    snapshot_task: asyncio.Task[None] | None = None

    @property
    def snapshot(self) -> Snapshot | None:
        """The snapshot in force, or None before the first one loaded."""
        if self.loader.version is None:
            return None
        return self.loader.current

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """Swap callback: watch exactly the snapshot's endpoints, forget the rest."""
        self.health.set_endpoints(snapshot.endpoints.values())
        self.breakers.retain(snapshot.endpoints)

    async def start(self) -> None:
        """Start the background work; a missing snapshot is retried, not fatal (not ready)."""
        await self.key_usage.start()
        await self.health.start()
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
        await self.loader.stop()
        await self.health.stop()
        await self.key_usage.stop()
        await self.client.close()


def build_state(config: RouterConfig) -> RouterState:
    """Create (not start) every component from ``config``."""
    client = UpstreamClient(
        ClientConfig(
            timeouts=TimeoutPolicy(
                connect_cap=config.connect_timeout_s, first_byte_cap=config.ttft_timeout_s
            )
        )
    )
    breakers = BreakerBook()
    health = HealthMonitor(client, HealthConfig(interval_s=config.health_interval_s))
    inflight = InFlight()
    state = RouterState(
        config=config,
        loader=SnapshotLoader(
            config.redis_url, config.snapshot_cache_path, prefix=config.snapshot_prefix
        ),
        client=client,
        breakers=breakers,
        health=health,
        inflight=inflight,
        table=RoutingTable(),
        signals=FleetSignals(breakers=breakers, health=health, inflight=inflight),
        metrics=RouterMetrics(max_tenant_labels=config.max_tenant_labels),
        key_usage=KeyUsageRecorder(
            config.redis_url,
            hash_key=config.key_usage_hash,
            interval_s=config.key_usage_flush_s,
        ),
        tokens=TokenCounter(cache_size=config.tokenizer_cache_size),
    )
    state.loader.add_swap_callback(state.on_snapshot)
    return state
