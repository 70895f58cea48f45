"""The router learns adapter residency from the workers' heartbeats.

A worker whose engine serves LoRA adapters lists the adapters its engine has loaded in its
heartbeat (``adapters``, read from the engine's ``/v1/models``: :mod:`runtime.workers.heartbeat`,
:func:`runtime.workers.adapter_loader.engine_adapters`), whoever loaded them: this router,
another router, or an operator. Every ``interval_s`` :class:`AdapterHeartbeats` reads the
heartbeat keys of the snapshot's endpoints that serve adapters (one ``MGET``) and tells the
router's residency book (:meth:`runtime.workers.adapter_loader.AdapterFleet.observe`), so
placement sends an adapter's requests to a replica that holds it even when this router never
loaded it there, and forgets endpoints that left the snapshot. A Redis error is logged once
and retried at the next tick; the residency the router made itself stays.

An engine that restarts at the same URL (the worker's supervisor starts a fresh one after a
death) holds no adapters: its heartbeat's ``started`` changes (and its state passes through
``restarting``), and the router drops what it knew of that replica
(:meth:`runtime.workers.adapter_loader.AdapterFleet.restarted`), so placement does not send
requests there as if the adapter were resident.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runtime.contract import endpoint_heartbeat_key
from runtime.redis_conn import async_client, cancel_and_wait
from runtime.snapshot import Snapshot
from runtime.workers.adapter_loader import AdapterFleet

logger = logging.getLogger(__name__)

NOT_SERVING: Final = frozenset({"restarting", "starting"})  # an engine that holds no adapters
POLL_S: Final = 2.0  # a worker beats every third of its 15 s TTL; reading more often is moot


def lora_endpoints(snapshot: Snapshot) -> list[int]:
    """The endpoints whose version has adapters (their replicas load them), sorted."""
    bases = {v.base_version for v in snapshot.versions.values() if v.base_version is not None}
    return sorted(e.id for e in snapshot.endpoints.values() if e.version in bases)


@dataclass(frozen=True, slots=True)
class Residency:
    """What one heartbeat says of its engine's adapters."""

    adapters: frozenset[str]
    started: object = None  # the engine's start (``started``, with the worker's ``pid``)


def heartbeat_residency(raw: bytes | str | None) -> Residency | None:
    """The residency in one heartbeat value; None when it lists no ``adapters``. An engine
    that is not ready (``restarting`` or ``starting`` again after a death) holds none,
    whatever its last list said."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    names = value.get("adapters") if isinstance(value, dict) else None
    if not isinstance(value, dict) or not isinstance(names, list):
        return None
    started = value.get("started")
    epoch = None if started is None else (value.get("pid"), started)
    if value.get("state") in NOT_SERVING:
        return Residency(frozenset(), epoch)
    return Residency(frozenset(n for n in names if isinstance(n, str)), epoch)


class AdapterHeartbeats:
    """Polls the heartbeats of LoRA endpoints into the router's residency book."""

    def __init__(
        self,
        redis_url: str,
        fleet: AdapterFleet,
        snapshot: Callable[[], Snapshot | None],
        *,
        interval_s: float = POLL_S,
        after_poll: Callable[[], None] | None = None,
    ) -> None:
        self._redis_url = redis_url
        self._after_poll = after_poll  # e.g. the adapter metrics' copy into this worker's files
        self._fleet = fleet
        self._snapshot = snapshot
        self._interval_s = interval_s
        self._task: asyncio.Task[None] | None = None
        self._client: aioredis.Redis[bytes] | None = None
        self._failing = False

    async def poll(self) -> int:
        """One read; the number of endpoints whose heartbeat listed adapters."""
        snapshot = self._snapshot()
        if snapshot is None:
            return 0
        self._fleet.forget(frozenset(snapshot.endpoints))
        ids = lora_endpoints(snapshot)
        if not ids:
            return 0
        if self._client is None:
            self._client = async_client(self._redis_url, name="adapter-heartbeats", timeout_s=2.0)
        values = await self._client.mget([endpoint_heartbeat_key(eid) for eid in ids])
        seen = 0
        for eid, raw in zip(ids, values, strict=True):
            found = heartbeat_residency(raw)
            if found is not None:
                self._fleet.observe(eid, found.adapters, started=found.started)
                seen += 1
        return seen

    async def _run(self) -> None:
        while True:
            try:
                await self.poll()
            except (RedisError, OSError) as exc:
                if not self._failing:
                    logger.warning("adapter heartbeats: Redis read failed (%s); retrying", exc)
                self._failing = True
            else:
                self._failing = False
            if self._after_poll is not None:
                self._after_poll()
            await asyncio.sleep(self._interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="adapter-heartbeats")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()  # type: ignore[attr-defined]  # types-redis predates it
