"""The router's side of the scaling signals: measure each pool once per interval and write one
Redis hash field per pool (off the request path; one pipeline per interval).

:class:`PoolMeter` turns a dispatcher's cumulative outcome counters into per-second rates by
difference with its previous reading; :class:`SignalsPublisher` runs it on a timer and writes
``{ns}:scaling:signals:{pool}`` field ``<router id>`` (the key expires after a few intervals,
so a router that stops leaves no stale demand). :func:`read_pool_signals` is the reader's half.

A pool whose signals are the same as those last written (all but their time: an idle pool,
nothing queued, no rate) is written again only once :data:`REFRESH_INTERVALS` intervals have
passed since, well within the key's expiry (:data:`TTL_INTERVALS`) and the reader's staleness
bound (``apps.scaling.services.SIGNALS_STALE_S``, 10 s): an idle router writes a third as
often, and any change is written at the interval it is measured in (issue #27).
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import msgspec
import redis.asyncio as aioredis

from runtime.contract import scaling_signals_key
from runtime.redis_conn import async_client, cancel_and_wait, raise_if_cancelling
from runtime.scaling.engines import EngineScraper
from runtime.scaling.signals import PoolSignals, decode, encode, p95
from runtime.scheduling.interfaces import DropReason
from runtime.snapshot import Snapshot
from runtime.telemetry.logging import RequestRecord

logger = logging.getLogger(__name__)

MISS_REASONS = (str(DropReason.DEADLINE_EXPIRED), str(DropReason.WAIT_EXCEEDS_DEADLINE))
SHED_REASONS = (str(DropReason.SHED), str(DropReason.QUEUE_FULL))
TTFT_WINDOW = 2048  # first-token times kept per pool and class between two readings
TTL_INTERVALS = 5  # a pool's key expires after this many intervals without a write
REFRESH_INTERVALS = 3  # unchanged signals are written again after this many intervals


class MeteredPool(Protocol):
    """What the meter reads of a pool's dispatcher (``PoolDispatcher``)."""

    pool: str
    outcomes: Counter[str]

    @property
    def waits(self) -> Mapping[int, Sequence[float]]: ...

    def queue_lengths(self) -> dict[int, int]: ...

    def inflight(self) -> dict[str, int]: ...


class PoolFleet(Protocol):
    """What the meter reads of the fleet: the pool's usable capacity, ready endpoints, KV use."""

    def capacity(self, pool: str) -> int: ...

    def ready(self, pool: str) -> int: ...

    def kv_usage(self, pool: str) -> float | None: ...


class PoolMeter:
    """Per-interval signals of the pools; keeps the previous counters to compute rates, and
    the interval's first-token times (:meth:`observe_ttft`)."""

    def __init__(
        self,
        fleet: PoolFleet,
        *,
        engines: EngineScraper | None = None,
        clock: Callable[[], float] = time.time,
        ttft_window: int = TTFT_WINDOW,
    ) -> None:
        self._fleet = fleet
        self._engines = engines
        self._clock = clock
        self._last: dict[str, tuple[float, Counter[str]]] = {}
        # pool -> class -> (seconds to first token, the class's TTFT SLO in seconds)
        self._ttft: dict[str, dict[str, deque[tuple[float, float]]]] = {}
        # pool -> class -> (a unary request's end-to-end seconds, the class's deadline)
        self._e2e: dict[str, dict[str, deque[tuple[float, float]]]] = {}
        self._ttft_window = ttft_window

    def observe_ttft(self, pool: str, klass: str, ttft_s: float, slo_s: float) -> None:
        """One stream's time to first token (queue + upstream) against its class's SLO."""
        per_class = self._ttft.setdefault(pool, {})
        per_class.setdefault(klass, deque(maxlen=self._ttft_window)).append((ttft_s, slo_s))

    def observe_e2e(self, pool: str, klass: str, e2e_s: float, deadline_s: float) -> None:
        """One unary request's end-to-end time against its class's deadline."""
        per_class = self._e2e.setdefault(pool, {})
        per_class.setdefault(klass, deque(maxlen=self._ttft_window)).append((e2e_s, deadline_s))

    async def refresh(self) -> None:
        """Read the engines' own series (once per interval, before :meth:`measure`)."""
        if self._engines is not None:
            await self._engines.refresh()

    async def close(self) -> None:
        if self._engines is not None:
            await self._engines.close()

    def _ttft_of(self, pool: str) -> tuple[dict[str, float], float]:
        """Streams' TTFT p95 per class, and the worst p95 / objective of the interval over
        both the streams' TTFT and the unary requests' e2e; the interval is then over."""
        per_p95, ratio = _p95s(self._ttft.pop(pool, {}))
        _, e2e_ratio = _p95s(self._e2e.pop(pool, {}))
        return per_p95, max(ratio, e2e_ratio)

    def measure(self, pool: MeteredPool) -> PoolSignals:
        now = self._clock()
        outcomes = Counter(pool.outcomes)
        then, before = self._last.get(pool.pool, (now, outcomes))
        self._last[pool.pool] = (now, outcomes)
        span = now - then
        delta = outcomes - before

        def rate(*reasons: str) -> float:
            return sum(delta[r] for r in reasons) / span if span > 0 else 0.0

        ttft_p95, ttft_ratio = self._ttft_of(pool.pool)
        engine = self._engines.reading(pool.pool) if self._engines is not None else None
        return PoolSignals(
            pool=pool.pool,
            at=now,
            interval_s=span,
            queued={str(b): n for b, n in pool.queue_lengths().items() if n},
            wait_p95_s={str(b): p95(list(w)) for b, w in pool.waits.items() if w},
            dispatched_per_s=rate("dispatched"),
            deadline_miss_per_s=rate(*MISS_REASONS),
            shed_per_s=rate(*SHED_REASONS),
            inflight=sum(pool.inflight().values()),
            capacity=self._fleet.capacity(pool.pool),
            ready=self._fleet.ready(pool.pool),
            kv_usage=self._fleet.kv_usage(pool.pool),
            ttft_p95_s=ttft_p95,
            ttft_slo_ratio=ttft_ratio,
            batch_fill=None if engine is None else engine.batch_fill,
            batch_compute_s=None if engine is None else engine.batch_compute_s,
        )


def _p95s(per_class: dict[str, deque[tuple[float, float]]]) -> tuple[dict[str, float], float]:
    """p95 per class of ``(seconds, objective)`` samples, and the worst p95 / objective."""
    per_p95: dict[str, float] = {}
    ratio = 0.0
    for klass, samples in per_class.items():
        if not samples:
            continue
        value = p95([t for t, _ in samples])
        per_p95[klass] = value
        slo = min(s for _, s in samples)
        if slo > 0:
            ratio = max(ratio, value / slo)
    return per_p95, ratio


class SignalsPublisher:
    """Every ``interval_s``: measure every pool of ``pools()`` and write it to Redis."""

    def __init__(
        self,
        redis_url: str,
        *,
        namespace: str,
        pools: Callable[[], Iterable[MeteredPool]],
        meter: PoolMeter,
        interval_s: float = 1.0,
        router_id: str | None = None,
    ) -> None:
        self._redis: aioredis.Redis[bytes] = async_client(redis_url, name="scaling-signals")
        self._namespace = namespace
        self._pools = pools
        self._meter = meter
        self.interval_s = interval_s
        self.router_id = router_id or uuid.uuid4().hex[:12]
        self._task: asyncio.Task[None] | None = None
        self._written: dict[str, PoolSignals] = {}  # pool -> the signals last written

    def observe_request(self, record: RequestRecord, snapshot: Snapshot | None) -> None:
        """Count one finished request's latency toward its pool's signals (the gateway calls
        this for every request; those that never reached an engine are left out): a stream's
        time to first token against its class's TTFT SLO; a unary request's end-to-end time
        against its class's deadline (its first byte is its whole answer), so a unary-only
        pool such as an encoder's is never blind (issue #33)."""
        timings = record.timings_ms
        first_ms = timings.get("upstream_ttft")
        if first_ms is None or snapshot is None or not record.endpoint.isdigit():
            return
        endpoint = snapshot.endpoints.get(int(record.endpoint))
        klass = snapshot.classes.get(record.klass)
        if endpoint is None or klass is None:
            return
        if record.stream:
            ttft_s = (first_ms + timings.get("queue", 0.0)) / 1000.0
            self._meter.observe_ttft(endpoint.pool, klass.name, ttft_s, klass.ttft_slo_ms / 1e3)
        elif "e2e" in timings:
            self._meter.observe_e2e(endpoint.pool, klass.name, timings["e2e"] / 1000.0,
                                    klass.deadline_ms / 1000.0)  # fmt: skip

    async def publish_once(self) -> int:
        """Measure every pool now and write those due (changed, or unchanged for
        :data:`REFRESH_INTERVALS` intervals); the number of pools written."""
        try:
            await self._meter.refresh()
        except Exception as exc:  # an engine page that cannot be read: that signal goes stale
            logger.warning("scaling signals: engine metrics not read: %s", exc)
        due = [s for s in (self._meter.measure(p) for p in self._pools()) if self._due(s)]
        if not due:
            return 0
        ttl = max(1, round(self.interval_s * TTL_INTERVALS))
        pipe = self._redis.pipeline(transaction=False)
        for signals in due:
            key = scaling_signals_key(self._namespace, signals.pool)
            pipe.hset(key, self.router_id, encode(signals))
            pipe.expire(key, ttl)
        try:
            await pipe.execute()
        except BaseException:
            for signals in due:  # not written: due again at the next interval
                self._written.pop(signals.pool, None)
            raise
        return len(due)

    def _due(self, signals: PoolSignals) -> bool:
        """Whether ``signals`` must be written (and, if so, remembered as written)."""
        last = self._written.get(signals.pool)
        if (
            last is not None
            and signals.at - last.at < self.interval_s * (REFRESH_INTERVALS - 0.5)
            and msgspec.structs.replace(signals, at=last.at, interval_s=last.interval_s) == last
        ):
            return False
        self._written[signals.pool] = signals
        return True

    async def _run(self) -> None:
        while True:
            try:
                await self.publish_once()
            except Exception as exc:  # Redis down: routing goes on, the signal goes stale
                logger.warning("scaling signals: publish failed: %s", exc)
            raise_if_cancelling()  # a cancellation redis-py turned into an error ends the loop
            await asyncio.sleep(self.interval_s)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="scaling-signals")

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            await cancel_and_wait(task)  # redis-py can swallow a cancellation mid-read
        await self._meter.close()
        await self._redis.aclose()  # type: ignore[attr-defined]


def parse_entries(raw: dict[bytes, bytes], *, now: float, stale_s: float) -> list[PoolSignals]:
    """The routers' entries of one pool hash, leaving out those older than ``stale_s``."""
    out: list[PoolSignals] = []
    for value in raw.values():
        try:
            signals = decode(value)
        except ValueError:
            continue
        if now - signals.at <= stale_s:
            out.append(signals)
    return out
