"""Single flight: concurrent identical misses make one upstream request.

Within a router, the first miss of a key leads (:class:`Lead`) and the others wait on its
future for the entry (a streaming follower then replays it). Across routers, the leader holds
a short Redis lease (``SET NX PX``); a router that finds the lease taken polls L2 for the
entry until it appears, the lease goes (it then takes the lease itself: a dead leader's lease
lapses after ``lease_s``) or the request's deadline passes (it then goes upstream alone).
A leader that fails resolves its followers with None: each then goes upstream itself.
"""

from __future__ import annotations

import asyncio
import secrets
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

from runtime.cache.entry import Entry
from runtime.cache.metrics import CacheMetrics
from runtime.contract import cache_lease_key

_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


@dataclass(slots=True)
class Lead:
    """The leader's duty: :meth:`finish` exactly once, with the entry or None."""

    flights: Flights
    key: str
    future: asyncio.Future[Entry | None]
    token: str = field(default_factory=lambda: secrets.token_hex(8))
    leased: bool = False
    done: bool = False

    async def finish(self, entry: Entry | None) -> None:
        if self.done:
            return
        self.done = True
        if not self.future.done():
            self.future.set_result(entry)
        if self.flights.local.get(self.key) is self.future:
            del self.flights.local[self.key]
        if self.leased:
            await self.flights.release(self.key, self.token)


class Flights:
    def __init__(
        self, client: aioredis.Redis[bytes], *, namespace: str, metrics: CacheMetrics,
        lease_s: float = 10.0, poll_s: float = 0.02,
    ) -> None:  # fmt: skip
        self._redis = client
        self._ns = namespace
        self.metrics = metrics
        self.lease_ms = int(lease_s * 1000)
        self.poll_s = poll_s
        self.local: dict[str, asyncio.Future[Entry | None]] = {}
        self._release: Any = client.register_script(_RELEASE)

    async def release(self, key: str, token: str) -> None:
        await self._release(keys=[cache_lease_key(self._ns, key)], args=[token])

    async def join(
        self, key: str, *, lookup: Callable[[], Awaitable[Entry | None]], deadline: float
    ) -> Entry | Lead | None:
        """The entry another request fetched, the lead (go upstream, then finish), or None
        (go upstream alone: the leader failed or the deadline is near)."""
        loop = asyncio.get_running_loop()
        waiting = self.local.get(key)
        if waiting is not None:
            self.metrics.joins.labels("local").inc()
            try:
                async with asyncio.timeout_at(deadline):
                    return await asyncio.shield(waiting)
            except TimeoutError:
                return None
        lead = Lead(self, key, loop.create_future())
        self.local[key] = lead.future
        joined = False
        try:
            while True:
                lease = cache_lease_key(self._ns, key)
                if await self._redis.set(lease, lead.token, nx=True, px=self.lease_ms):
                    lead.leased = True
                    # Look again: a leader that finished while this request was between its own
                    # store miss and here has stored the answer (else a second upstream call).
                    entry = await lookup()
                    if entry is None:
                        return lead
                    await lead.finish(entry)
                    return entry
                if not joined:
                    joined = True
                    self.metrics.joins.labels("remote").inc()
                entry = await lookup()
                if entry is not None or loop.time() + self.poll_s >= deadline:
                    await lead.finish(entry)
                    return entry
                await asyncio.sleep(self.poll_s)
        except BaseException:
            await lead.finish(None)
            raise
