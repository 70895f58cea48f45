"""Engine-side scaling signals the router reads off its pools' workers: the encoder batcher's
batch fill and compute time (``encoder:batch_fill_ratio``, ``encoder:batch_compute_seconds``
histograms of :mod:`runtime.workers.encoder.metrics`), as means over the last interval.

:class:`EngineScraper` fetches ``/metrics`` of every ready endpoint whose version runs on the
``torch`` runtime (vLLM pages are large and carry no batcher series: they are not fetched), once
per publishing interval, off the request path; it keeps each endpoint's previous histogram
totals, so a reading is ``Δsum / Δcount`` over the interval (None with no batch in it).
The pages are fetched by :meth:`UpstreamClient.probe <runtime.upstream.client.UpstreamClient.probe>`
(its small probe pool): pass the router's client in, or the scraper opens one of its own and
closes it in :meth:`EngineScraper.close`; a page that cannot be read (any classified upstream
failure, a non-200 answer) is left out of that interval.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from runtime.snapshot import Snapshot
from runtime.tls import upstream_context
from runtime.upstream.client import ClientConfig, UpstreamClient
from runtime.upstream.errors import UpstreamError

FILL = "encoder:batch_fill_ratio"
COMPUTE = "encoder:batch_compute_seconds"
SCRAPED_RUNTIMES = ("torch",)

Fetch = Callable[[str], Awaitable[str | None]]


def histogram_totals(text: str, name: str) -> tuple[float, float]:
    """(sum, count) of histogram ``name`` over all its label sets in an exposition text."""
    total = count = 0.0
    for line in text.splitlines():
        metric = line.split("{", 1)[0].split(" ", 1)[0]
        if metric == f"{name}_sum":
            total += float(line.rpartition(" ")[2])
        elif metric == f"{name}_count":
            count += float(line.rpartition(" ")[2])
    return total, count


@dataclass(frozen=True, slots=True)
class EngineReading:
    batch_fill: float | None = None  # mean batch size / size cap over the interval
    batch_compute_s: float | None = None  # mean seconds computing one batch


@dataclass(frozen=True, slots=True)
class _Totals:
    fill_sum: float
    fill_count: float
    compute_sum: float
    compute_count: float


def _mean(delta_sum: float, delta_count: float) -> float | None:
    return delta_sum / delta_count if delta_count > 0 else None


class EngineScraper:
    """Per-pool engine readings, refreshed by the signals publisher once per interval."""

    def __init__(
        self,
        snapshot: Callable[[], Snapshot | None],
        *,
        timeout_s: float = 0.5,
        fetch: Fetch | None = None,
        client: UpstreamClient | None = None,
    ) -> None:
        self._snapshot = snapshot
        self._timeout_s = timeout_s
        self._fetch = fetch
        self._given = client
        self._client: UpstreamClient | None = client
        self._last: dict[int, _Totals] = {}
        self._readings: dict[str, EngineReading] = {}

    def _targets(self) -> list[tuple[int, str, str]]:
        """(endpoint id, pool, base URL) of the ready endpoints worth scraping."""
        snapshot = self._snapshot()
        if snapshot is None:
            return []
        out = []
        for e in snapshot.endpoints.values():
            version = snapshot.versions.get(e.version)
            if e.state == "ready" and version is not None and version.runtime in SCRAPED_RUNTIMES:
                out.append((e.id, e.pool, e.base_url))
        return out

    async def _get(self, base_url: str) -> str | None:
        if self._fetch is not None:
            return await self._fetch(base_url)
        if self._client is None:
            self._client = UpstreamClient(ClientConfig(tls=upstream_context(os.environ)))
        try:
            status, page = await self._client.probe(base_url, "/metrics", timeout_s=self._timeout_s)
        except UpstreamError:
            return None
        return page.decode("utf-8", "replace") if status == 200 else None

    async def refresh(self) -> None:
        targets = self._targets()
        pages = await asyncio.gather(*(self._get(url) for _, _, url in targets))
        per_pool: dict[str, list[tuple[float, float, float, float]]] = {}
        seen: set[int] = set()
        for (endpoint_id, pool, _url), page in zip(targets, pages, strict=True):
            if page is None:
                continue
            seen.add(endpoint_id)
            now = _Totals(*histogram_totals(page, FILL), *histogram_totals(page, COMPUTE))
            before = self._last.get(endpoint_id, now)
            self._last[endpoint_id] = now
            per_pool.setdefault(pool, []).append(
                (now.fill_sum - before.fill_sum, now.fill_count - before.fill_count,
                 now.compute_sum - before.compute_sum, now.compute_count - before.compute_count)
            )  # fmt: skip
        self._last = {k: v for k, v in self._last.items() if k in seen}
        self._readings = {pool: _reading(deltas) for pool, deltas in per_pool.items()}

    def reading(self, pool: str) -> EngineReading:
        return self._readings.get(pool, EngineReading())

    async def close(self) -> None:
        """Close the client if the scraper opened it (an injected one is its owner's)."""
        client, self._client = self._client, self._given
        if client is not None and client is not self._given:
            await client.close()


def _reading(deltas: Iterable[tuple[float, float, float, float]]) -> EngineReading:
    fill_sum = fill_count = compute_sum = compute_count = 0.0
    for fs, fc, cs, cc in deltas:
        fill_sum, fill_count = fill_sum + fs, fill_count + fc
        compute_sum, compute_count = compute_sum + cs, compute_count + cc
    return EngineReading(_mean(fill_sum, fill_count), _mean(compute_sum, compute_count))
