"""Per-second live aggregates of one router, published to Redis for the dashboard.

The request path calls :meth:`LiveAggregator.record` once per finished request: a dict lookup
and a few additions into the current second's bucket (no I/O, no sorting). A background task
closes the bucket once a second, adds what the router knows right now (queue depth per band,
in flight vs capacity per endpoint, tenant shares, Jain's index) and publishes one JSON document:

- ``PUBLISH {ns}:live <doc>`` for whoever listens now (the control plane's websocket relay);
- ``LPUSH {ns}:live:recent <doc>`` + ``LTRIM`` to :data:`BACKLOG` documents, so a browser
  that (re)connects backfills the last minutes.

A row is one (tenant, model, version, class, pool) with requests, outcomes, 429s, shed, TTFT,
inter-token (ITL) and end-to-end percentiles, mean per-stage latency (gateway → queue →
upstream first token → stream) and tokens. A request's ITL is its ``itl`` timing when the
gateway records one, else (streams only) its mean gap after the first token:
(e2e - TTFT) / (tokens - 1).
The document also carries the router's own view of the routes (model → version → weight) and
the snapshot version it serves. A failed publish is logged and dropped: live data is not worth
a retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from runtime.contract import live_backlog, live_channel
from runtime.redis_conn import async_client, cancel_and_wait, raise_if_cancelling
from runtime.telemetry.logging import RequestRecord

logger = logging.getLogger(__name__)

DOC_VERSION: Final = 1
BACKLOG: Final = 600  # documents kept for backfill (10 minutes of one router)
MAX_SAMPLES: Final = 256  # latency samples kept per row and second
SHED_OUTCOMES: Final = frozenset({"shed", "queue_full", "wait_exceeds_deadline"})
STAGES: Final = ("gateway", "queue", "upstream_ttft", "stream")

_ENCODER = msgspec.json.Encoder()


RowKey = tuple[str, str, str, str, str]  # tenant, model, version, class, pool


class _Row:
    """One key's numbers within one second."""

    __slots__ = (
        "e2e",
        "errors",
        "itl",
        "outcomes",
        "requests",
        "shed",
        "stages",
        "throttled",
        "tokens_in",
        "tokens_out",
        "ttft",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.errors = 0
        self.throttled = 0
        self.shed = 0
        self.outcomes: dict[str, int] = {}
        self.ttft: list[float] = []
        self.e2e: list[float] = []
        self.itl: list[float] = []
        self.stages = [0.0, 0.0, 0.0, 0.0, 0.0]  # sums of STAGES, then how many requests
        self.tokens_in = 0
        self.tokens_out = 0

    def add(self, record: RequestRecord) -> None:
        self.requests += 1
        outcome = record.outcome or "unknown"
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        if record.status >= 400 or outcome not in ("ok", "unknown"):
            self.errors += 1
        if record.status == 429:
            self.throttled += 1
        if outcome in SHED_OUTCOMES:
            self.shed += 1
        self.tokens_in += record.prompt_tokens or 0
        self.tokens_out += record.completion_tokens or 0
        timings = record.timings_ms
        e2e = timings.get("e2e")
        if e2e is not None:
            _sample(self.e2e, e2e, self.requests)
        ttft = timings.get("ttft")
        if ttft is None or e2e is None:
            return
        if record.stream:  # a unary answer's first byte is its whole answer: no TTFT (#33)
            _sample(self.ttft, ttft, self.requests)
        itl = timings.get("itl")
        tokens = record.completion_tokens or 0
        if itl is None and record.stream and tokens > 1:  # unary: one body, no gaps seen
            itl = max(e2e - ttft, 0.0) / (tokens - 1)
        if itl is not None:
            _sample(self.itl, itl, self.requests)
        queue = timings.get("queue", 0.0)
        upstream = timings.get("upstream_ttft", 0.0)
        stages = self.stages
        stages[0] += max(ttft - queue - upstream, 0.0)
        stages[1] += queue
        stages[2] += upstream
        stages[3] += max(e2e - ttft, 0.0)
        stages[4] += 1

    def document(self, key: RowKey) -> dict[str, Any]:
        tenant, model, version, klass, pool = key
        served = self.stages[4]
        return {
            "tenant": tenant,
            "model": model,
            "version": version,
            "class": klass,
            "pool": pool,
            "requests": self.requests,
            "errors": self.errors,
            "throttled": self.throttled,
            "shed": self.shed,
            "outcomes": self.outcomes,
            "ttft_ms": percentiles(self.ttft),
            "itl_ms": percentiles(self.itl),
            "e2e_ms": percentiles(self.e2e),
            "stages_ms": {
                name: round(self.stages[i] / served, 3) if served else None
                for i, name in enumerate(STAGES)
            },
            "tokens_in": self.tokens_in,
            "tokens_out": self.tokens_out,
        }


def _sample(samples: list[float], value: float, seen: int) -> None:
    """Keep at most MAX_SAMPLES: past the cap, overwrite a slot in turn (O(1))."""
    if len(samples) < MAX_SAMPLES:
        samples.append(value)
    else:
        samples[seen % MAX_SAMPLES] = value


def percentiles(samples: list[float]) -> dict[str, float] | None:
    """p50/p95/p99 (nearest rank) of ``samples``, or None when there are none."""
    if not samples:
        return None
    ordered = sorted(samples)
    last = len(ordered) - 1
    return {
        f"p{q}": round(ordered[min(last, (q * len(ordered) + 99) // 100 - 1)], 3)
        for q in (50, 95, 99)
    }


@dataclass(slots=True, kw_only=True)
class LiveSources:
    """What the publisher reads once a second besides the requests (all optional)."""

    pool_of: Callable[[str], str] = lambda endpoint: ""
    pools: Callable[[], Iterable[dict[str, Any]]] = lambda: ()
    endpoints: Callable[[], Iterable[dict[str, Any]]] = lambda: ()
    classes: Callable[[], dict[str, dict[str, Any]]] = dict
    routes: Callable[[], dict[str, dict[str, int]]] = dict  # model -> version label -> weight
    snapshot_version: Callable[[], int | None] = lambda: None


@dataclass(slots=True)
class LiveAggregator:
    """Buckets requests per second and publishes one document per second (see module doc)."""

    redis_url: str
    namespace: str
    sources: LiveSources = field(default_factory=LiveSources)
    interval_s: float = 1.0
    backlog: int = BACKLOG
    clock: Callable[[], float] = time.time
    router_id: str = field(default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}")
    _rows: dict[RowKey, _Row] = field(default_factory=dict)
    _client: aioredis.Redis[bytes] | None = None
    _task: asyncio.Task[None] | None = None

    def record(self, record: RequestRecord) -> None:
        """Count one finished request into the current bucket (no I/O)."""
        key = (
            record.tenant,
            record.model,
            record.version,
            record.klass,
            self.sources.pool_of(record.endpoint) if record.endpoint else "",
        )
        row = self._rows.get(key)
        if row is None:
            row = self._rows[key] = _Row()
        row.add(record)

    def close_bucket(self) -> dict[str, Any]:
        """Take the current bucket and build its document (starts a new bucket)."""
        rows, self._rows = self._rows, {}
        return {
            "v": DOC_VERSION,
            "router": self.router_id,
            "ts": round(self.clock(), 3),
            "interval_s": self.interval_s,
            "rows": [row.document(key) for key, row in rows.items()],
            "pools": list(self.sources.pools()),
            "endpoints": list(self.sources.endpoints()),
            "classes": self.sources.classes(),
            "routes": self.sources.routes(),
            "snapshot_version": self.sources.snapshot_version(),
        }

    async def start(self) -> None:
        if self._task is not None:
            raise RuntimeError("LiveAggregator already started")
        self._client = async_client(
            self.redis_url, name="live-publisher", timeout_s=2.0, connect_timeout_s=1.0
        )
        self._task = asyncio.create_task(self._run(), name="live-publisher")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)  # redis-py can swallow a cancellation mid-read
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(RedisError, OSError):
                await client.aclose()  # type: ignore[attr-defined]

    async def publish_once(self) -> bool:
        """Close the bucket and publish it; False when Redis refused (the bucket is dropped)."""
        document = self.close_bucket()
        if self._client is None:
            return False
        payload = _ENCODER.encode(document)
        backlog_key = live_backlog(self.namespace)
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                pipe.publish(live_channel(self.namespace), payload)
                pipe.lpush(backlog_key, payload)
                pipe.ltrim(backlog_key, 0, self.backlog - 1)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            logger.warning("live: publish failed (%r); dropped one second", exc)
            return False
        return True

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.interval_s
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at += self.interval_s
            try:
                await self.publish_once()
            except Exception:  # a bad source must not end the publisher
                logger.exception("live: building the document failed")
            raise_if_cancelling()  # a cancellation redis-py turned into an error ends the loop
