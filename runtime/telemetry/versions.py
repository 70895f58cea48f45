"""Per-version request telemetry for rollout gates, aggregated in the router, flushed to Redis.

The request path calls :meth:`VersionStats.record` once per accounted request (a few
increments of a preallocated row of counts per version and bucket, no I/O, no field names
built). A background task folds the rows into field names and flushes the pending counts every
``interval_s`` with one pipelined ``HINCRBY`` batch into time buckets::

    {ns}:vstats:{model}|{version label}:{bucket}   hash, bucket = unix time // BUCKET_S

(the key: :func:`runtime.contract.version_stats_key`, re-exported here as ``stats_key``)

Fields: ``n`` requests, ``err`` server-side failures (status >= 500), ``err:<outcome>`` the
same by kind, ``pt``/``ct`` prompt/completion tokens, ``ttft:<i>`` the TTFT histogram of
streams (bucket ``i`` of :data:`TTFT_BOUNDS_MS`, the last one open), ``e2e:<i>`` the
end-to-end histogram of unary requests that reached an engine (:data:`E2E_BOUNDS_MS`: a
unary "first byte" is the whole answer, so it is no TTFT), ``itl:<i>`` the inter-token latency
histogram (every gap between two streamed events, buckets of :data:`ITL_BOUNDS_MS`). Every
router replica adds into the same hashes; the rollout evaluator reads the same window for
stable and candidate with :func:`read_window`. Buckets expire after :data:`TTL_S`. A failed
flush keeps the counts.
"""

from __future__ import annotations

import bisect
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import RedisError

from runtime.contract import version_stats_key as stats_key
from runtime.flusher import PeriodicFlusher
from runtime.telemetry.logging import RequestRecord

logger = logging.getLogger(__name__)

BUCKET_S = 2
TTL_S = 6 * 3600
TTFT_BOUNDS_MS: tuple[float, ...] = (
    5, 10, 20, 35, 50, 75, 100, 150, 200, 300, 450, 700, 1000, 1500, 2500, 4000, 7000, 12000,
)  # fmt: skip

ITL_BOUNDS_MS: tuple[float, ...] = (
    1, 2, 3, 5, 7.5, 10, 15, 20, 30, 45, 70, 100, 150, 250, 400, 700, 1000, 2000,
)  # fmt: skip

E2E_BOUNDS_MS: tuple[float, ...] = (
    10, 25, 50, 100, 200, 350, 500, 750, 1000, 1500, 2500, 4000, 7000, 12000, 20000, 35000,
    60000, 120000, 300000, 600000,
)  # fmt: skip


# A pending row's layout: n, err, pt, ct, then the TTFT, e2e and ITL histograms' buckets.
_N, _ERR, _PT, _CT = 0, 1, 2, 3
_TTFT = 4
_E2E = _TTFT + len(TTFT_BOUNDS_MS) + 1
_ITL = _E2E + len(E2E_BOUNDS_MS) + 1
_FIELDS: tuple[str, ...] = (
    "n", "err", "pt", "ct",
    *(f"ttft:{i}" for i in range(len(TTFT_BOUNDS_MS) + 1)),
    *(f"e2e:{i}" for i in range(len(E2E_BOUNDS_MS) + 1)),
    *(f"itl:{i}" for i in range(len(ITL_BOUNDS_MS) + 1)),
)  # fmt: skip


class _Row:
    """One version's pending counts in one bucket (``counts`` in :data:`_FIELDS` order)."""

    __slots__ = ("counts", "errors")

    def __init__(self) -> None:
        self.counts = [0] * len(_FIELDS)
        self.errors: Counter[str] = Counter()  # "err:<outcome>" -> count

    def fields(self) -> Counter[str]:
        """The Redis hash fields and their increments (those that moved)."""
        moved = zip(_FIELDS, self.counts, strict=True)
        found = Counter({name: value for name, value in moved if value})
        found.update(self.errors)
        return found


PendingKey = tuple[str, str, int]  # (model, version label, bucket)


def ttft_bucket(ms: float) -> int:
    return bisect.bisect_left(TTFT_BOUNDS_MS, ms)


def itl_bucket(ms: float) -> int:
    return bisect.bisect_left(ITL_BOUNDS_MS, ms)


class VersionStats(PeriodicFlusher):
    """The router's pending per-version counts and their flusher."""

    def __init__(
        self,
        redis_url: str,
        *,
        namespace: str,
        interval_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(redis_url, interval_s=interval_s, name="switchyard-version-stats")
        self._namespace = namespace
        self._clock = clock
        self._pending: dict[PendingKey, _Row] = {}
        self._retry: dict[str, Counter[str]] = {}  # a failed flush's counts, by Redis key
        self._itl_bucket = functools.partial(bisect.bisect_left, ITL_BOUNDS_MS)  # C, no frame

    def record(
        self,
        *,
        model: str,
        version: str,
        status: int,
        outcome: str,
        ttft_ms: float | None,
        prompt_tokens: int | None,
        completion_tokens: int | None,
        itl_ms: Sequence[float] = (),
        e2e_ms: float | None = None,
    ) -> None:
        """Count one request that was routed to ``version`` (no I/O): ``ttft_ms`` for a
        stream, ``e2e_ms`` for a unary request that reached an engine."""
        if not model or not version:
            return  # refused before a version was chosen: nothing to compare
        key = (model, version, int(self._clock()) // BUCKET_S)
        row = self._pending.get(key)
        if row is None:
            row = self._pending[key] = _Row()
        counts = row.counts
        counts[_N] += 1
        if status >= 500 or status == 0:
            counts[_ERR] += 1
            row.errors[f"err:{outcome or 'error'}"] += 1
        if ttft_ms is not None:
            counts[_TTFT + bisect.bisect_left(TTFT_BOUNDS_MS, ttft_ms)] += 1
        if e2e_ms is not None:
            counts[_E2E + bisect.bisect_left(E2E_BOUNDS_MS, e2e_ms)] += 1
        for index in map(self._itl_bucket, itl_ms):
            counts[_ITL + index] += 1
        if prompt_tokens:
            counts[_PT] += prompt_tokens
        if completion_tokens:
            counts[_CT] += completion_tokens

    def record_request(self, record: RequestRecord) -> None:
        """:meth:`record` from the gateway's finished request record."""
        timings = record.timings_ms
        reached = "upstream_ttft" in timings  # it reached an engine
        self.record(
            model=record.model,
            version=record.version,
            status=record.status,
            outcome=record.outcome,
            ttft_ms=timings["upstream_ttft"] if reached and record.stream else None,
            e2e_ms=timings.get("e2e") if reached and not record.stream else None,
            prompt_tokens=record.prompt_tokens,
            completion_tokens=record.completion_tokens,
            itl_ms=record.itl_ms,
        )

    @property
    def pending(self) -> int:
        """Buckets waiting for a flush (one per version and time bucket)."""
        return len(self.pending_fields())

    def pending_fields(self) -> dict[str, Counter[str]]:
        """What the next flush would write: Redis key -> fields and their increments."""
        batch = {key: Counter(counts) for key, counts in self._retry.items()}
        for (model, version, bucket), row in self._pending.items():
            key = stats_key(self._namespace, model, version, bucket)
            batch.setdefault(key, Counter()).update(row.fields())
        return batch

    def _batch(self) -> dict[str, Counter[str]]:
        """:meth:`pending_fields`, and nothing pending any more."""
        batch = self.pending_fields()
        self._pending, self._retry = {}, {}
        return batch

    async def flush(self) -> int:
        """Write the pending counts; returns how many buckets were written (0 on failure)."""
        if not (self._pending or self._retry) or self._client is None:
            return 0
        batch = self._batch()
        try:
            async with self._client.pipeline(transaction=False) as pipe:
                for key, counts in batch.items():
                    for name, value in counts.items():
                        pipe.hincrby(key, name, value)
                    pipe.expire(key, TTL_S)
                await pipe.execute()
        except (RedisError, OSError) as exc:
            logger.warning("version stats: flush of %d buckets failed (%r)", len(batch), exc)
            for key, counts in batch.items():
                self._retry.setdefault(key, Counter()).update(counts)
            return 0
        return len(batch)


@dataclass(slots=True)
class WindowStats:
    """One version's totals over a window (what the gates compare)."""

    requests: int = 0
    errors: int = 0
    errors_by_kind: dict[str, int] = field(default_factory=dict)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_counts: list[int] = field(default_factory=lambda: [0] * (len(TTFT_BOUNDS_MS) + 1))
    itl_counts: list[int] = field(default_factory=lambda: [0] * (len(ITL_BOUNDS_MS) + 1))
    e2e_counts: list[int] = field(default_factory=lambda: [0] * (len(E2E_BOUNDS_MS) + 1))

    def add(self, fields: Mapping[bytes, bytes]) -> None:
        for raw_name, raw_value in fields.items():
            name, value = raw_name.decode(), int(raw_value)
            if name == "n":
                self.requests += value
            elif name == "err":
                self.errors += value
            elif name.startswith("err:"):
                kind = name[4:]
                self.errors_by_kind[kind] = self.errors_by_kind.get(kind, 0) + value
            elif name == "pt":
                self.prompt_tokens += value
            elif name == "ct":
                self.completion_tokens += value
            elif name.startswith("ttft:"):
                _add_bucket(self.ttft_counts, name[5:], value)
            elif name.startswith("itl:"):
                _add_bucket(self.itl_counts, name[4:], value)
            elif name.startswith("e2e:"):
                _add_bucket(self.e2e_counts, name[4:], value)

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "errors": self.errors,
            "errors_by_kind": dict(self.errors_by_kind),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "ttft_samples": sum(self.ttft_counts),
            "itl_samples": sum(self.itl_counts),
            "e2e_samples": sum(self.e2e_counts),
        }


def _add_bucket(counts: list[int], raw_index: str, value: int) -> None:
    index = int(raw_index)
    if 0 <= index < len(counts):
        counts[index] += value


def read_window(
    client: redis.Redis[bytes],
    *,
    namespace: str,
    model: str,
    versions: Iterable[str],
    since: float,
    until: float,
) -> dict[str, WindowStats]:
    """Totals per version over the buckets that start in ``[since, until]`` (unix seconds)."""
    labels = list(versions)
    first, last = int(since) // BUCKET_S, int(until) // BUCKET_S
    pipe = client.pipeline(transaction=False)
    order: list[str] = []
    for label in labels:
        for bucket in range(first, last + 1):
            pipe.hgetall(stats_key(namespace, model, label, bucket))
            order.append(label)
    totals = {label: WindowStats() for label in labels}
    for label, fields in zip(order, pipe.execute(), strict=True):
        if fields:
            totals[label].add(fields)
    return totals
