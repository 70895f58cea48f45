"""Shadow traffic: mirror a share of a model's requests to a rollout's candidate, discard the
answer.

The route in the snapshot names the candidate (``shadow_version``) and the share
(``shadow_share``, 0..1). After a request is planned, :meth:`ShadowMirror.offer` draws once; on
a hit it starts a fire-and-forget task that POSTs the same body to a ready endpoint of the
candidate and reads the answer to the end, then drops it. The user's request never waits for
it: ``offer`` does no I/O, and when the mirror's own slot cap (``max_inflight``) is used up the
copy is dropped rather than queued, so shadow traffic is always the first to go (the lowest
band of all). The mirror is never billed: it never reaches admission, limits or metering.
What the candidate did is counted in the per-version telemetry (requests, errors, TTFT to
the response headers), under the candidate's label.

The copies go through a :class:`~runtime.upstream.drain.DrainClient` (the upstream package does
the network I/O): pass one in, or the mirror opens its own at :meth:`ShadowMirror.start` and
closes it at :meth:`ShadowMirror.stop`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random

from runtime.snapshot import ModelSnap, Snapshot, VersionSnap
from runtime.telemetry.versions import VersionStats
from runtime.upstream.drain import DrainClient
from runtime.upstream.errors import UpstreamError

logger = logging.getLogger(__name__)


class ShadowMirror:
    def __init__(
        self,
        *,
        stats: VersionStats | None = None,
        max_inflight: int = 4,
        timeout_s: float = 60.0,
        rng: random.Random | None = None,
        client: DrainClient | None = None,
    ) -> None:
        self._stats = stats
        self._max_inflight = max_inflight
        self._timeout_s = timeout_s
        self._rng = rng or random.Random()  # noqa: S311 (sampling, not security)
        self._tasks: set[asyncio.Task[None]] = set()
        self._given = client
        self._client: DrainClient | None = None
        self.sent = 0
        self.dropped = 0

    async def start(self) -> None:
        self._client = self._given or DrainClient(
            timeout_s=self._timeout_s, limit=self._max_inflight
        )

    async def stop(self) -> None:
        """Cancel the copies in flight and close the client if the mirror opened it."""
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        client, self._client = self._client, None
        if client is not None and client is not self._given:
            await client.close()

    @property
    def inflight(self) -> int:
        return len(self._tasks)

    def offer(
        self, snapshot: Snapshot, model: ModelSnap, served: VersionSnap, path: str, body: bytes,
        *, streaming: bool = False,
    ) -> bool:  # fmt: skip
        """Maybe mirror this request (no I/O here); True when a copy was started. A streamed
        copy's first byte is its TTFT; a unary copy is timed end to end (its first byte is the
        whole answer)."""
        route = snapshot.routes.get(model.name)
        if route is None or route.shadow_version is None or route.shadow_share <= 0:
            return False
        if served.id == route.shadow_version or self._client is None:
            return False
        if self._rng.random() >= route.shadow_share:
            return False
        candidate = snapshot.versions.get(route.shadow_version)
        endpoints = [
            e.base_url
            for e in snapshot.endpoints.values()
            if e.version == route.shadow_version and e.state == "ready"
        ]
        if candidate is None or not endpoints:
            return False
        if len(self._tasks) >= self._max_inflight:
            self.dropped += 1
            return False
        url = self._rng.choice(endpoints) + path
        task = asyncio.create_task(
            self._send(model.name, candidate.label, url, body, streaming=streaming)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self.sent += 1
        return True

    async def _send(
        self, model: str, version: str, url: str, body: bytes, *, streaming: bool
    ) -> None:
        assert self._client is not None
        status, first_ms, total_ms = 0, None, None
        try:
            answer = await self._client.post(url, body)
            status, first_ms = answer.status, answer.headers_s * 1000.0
            total_ms = answer.total_s * 1000.0
            if answer.broken is not None:
                logger.debug("shadow: copy to %s cut short: %s", url, answer.broken)
        except UpstreamError as exc:
            logger.debug("shadow: copy to %s failed: %s", url, exc)
        finally:
            if self._stats is not None:
                with contextlib.suppress(Exception):
                    self._stats.record(
                        model=model, version=version, status=status,
                        outcome="ok" if 200 <= status < 300 else "shadow_error",
                        ttft_ms=first_ms if status == 200 and streaming else None,
                        e2e_ms=total_ms if status == 200 and not streaming else None,
                        prompt_tokens=None, completion_tokens=None,
                    )  # fmt: skip
