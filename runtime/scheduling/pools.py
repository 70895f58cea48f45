"""Every pool's dispatcher, built on first use and kept in step with the snapshot.

A pool's :class:`~.dispatcher.PoolDispatcher` is built the first time a request for it
arrives, from the pool's ``policies`` and the snapshot's request classes
(:class:`~.settings.PoolSettings`). On every snapshot swap each dispatcher takes its pool's
new settings (:meth:`~.dispatcher.PoolDispatcher.update`: queued requests and counters are
kept); a dispatcher whose pool left the snapshot is stopped (its waiting requests get 503).
Bad policy values are logged and replaced by the defaults, so a typo cannot take a pool down.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from runtime.policy_names import UnknownPolicyError
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.ports import Placement
from runtime.scheduling.settings import PoolSettings, SettingsError
from runtime.scheduling.shared import SharedCounters
from runtime.snapshot import Snapshot

logger = logging.getLogger(__name__)


class Dispatchers:
    def __init__(
        self,
        *,
        placement_for: Callable[[str], Placement],
        tick_s: float = 0.05,
        default_queue_limit: int = 1000,
        headroom_window_s: float = 10.0,
        shared: SharedCounters | None = None,
        cold_start: Callable[[int], float | None] | None = None,
    ) -> None:
        self._placement_for = placement_for
        self._cold_start = cold_start
        self._tick_s = tick_s
        self._default_limit = default_queue_limit
        self._headroom_window_s = headroom_window_s
        self._shared = shared
        self._pools: dict[str, PoolDispatcher] = {}
        self._stopping: set[asyncio.Task[None]] = set()

    def all(self) -> list[PoolDispatcher]:
        return list(self._pools.values())

    def settings_for(self, snapshot: Snapshot, pool: str) -> PoolSettings:
        snap = snapshot.pools.get(pool)
        policies = snap.policies if snap is not None else {}
        classes = snapshot.classes.values()
        try:
            settings = PoolSettings.from_policies(
                policies, classes, default_limit=self._default_limit
            )
            settings.policies()  # every name must be registered
        except (SettingsError, UnknownPolicyError) as exc:
            # The control plane refuses these (runtime.pool_policies); an old snapshot may not.
            logger.error(  # noqa: TRY400 - the message is the point, not the stack
                "scheduling: pool %s has invalid policies %r (%s); it schedules with the "
                "DEFAULT policies until a snapshot fixes them",
                pool,
                policies,
                exc,
            )
            settings = PoolSettings.from_policies({}, classes, default_limit=self._default_limit)
        return settings

    def get(self, snapshot: Snapshot, pool: str) -> PoolDispatcher:
        """The pool's dispatcher, built (and started) on first use."""
        dispatcher = self._pools.get(pool)
        if dispatcher is None:
            loop = asyncio.get_running_loop()
            dispatcher = PoolDispatcher(
                pool,
                self.settings_for(snapshot, pool),
                self._placement_for(pool),
                clock=loop.time,
                tick_s=self._tick_s,
                sink=self._shared,
                headroom_window_s=self._headroom_window_s,
                cold_start=self._cold_start,
            )
            self._pools[pool] = dispatcher
            if self._shared is not None:
                self._shared.attach(pool, dispatcher)
            dispatcher.start()
        return dispatcher

    def on_snapshot(self, snapshot: Snapshot) -> None:
        """Swap callback: new settings for every pool; retire the pools that are gone."""
        for name, dispatcher in list(self._pools.items()):
            if name in snapshot.pools:
                dispatcher.update(self.settings_for(snapshot, name))
                continue
            del self._pools[name]
            if self._shared is not None:
                self._shared.detach(name, dispatcher)
            task = asyncio.get_running_loop().create_task(
                dispatcher.stop(f"the pool '{name}' was removed"), name=f"retire-{name}"
            )
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def stop(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for dispatcher in pools:
            await dispatcher.stop()
        for task in list(self._stopping):
            await task
