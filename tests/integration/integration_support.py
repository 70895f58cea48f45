"""Helpers for the scheduling integration tests: simulator and router processes, a world
with pools whose policies are chosen by name, and an open-loop streaming load generator."""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

import aiohttp
import msgspec
from fixtures.router import World, routers, start_simulator

from runtime.snapshot import RequestClassSnap, TenantLimits

# routers and start_simulator live in fixtures.router; re-exported for the tests that import
# them from here.
__all__ = [
    "OpenLoop",
    "Outcome",
    "add_class",
    "p95",
    "routers",
    "set_policies",
    "start_simulator",
    "stream_once",
    "tenant_limits",
]


def tenant_limits(*, rpm: int = 100_000, concurrency: int = 10_000) -> TenantLimits:
    return TenantLimits(
        rpm=rpm, tpm=1_000_000_000, max_concurrency=concurrency, max_context_tokens=4096,
        max_output_tokens=512,
    )  # fmt: skip


def set_policies(world: World, pool: str, **policies: str) -> None:
    world.pools[pool] = msgspec.structs.replace(world.pools[pool], policies=dict(policies))


def add_class(
    world: World, name: str, *, band: int, deadline_ms: int, max_queue: int = 100
) -> None:
    world.classes[name] = RequestClassSnap(
        name=name, priority_band=band, ttft_slo_ms=min(1000, deadline_ms),
        deadline_ms=deadline_ms, max_queue_length=max_queue, shed_order=band,
    )  # fmt: skip


@dataclass
class Outcome:
    tenant: str
    model: str
    phase: str
    status: int
    ttft_s: float  # inf when the request failed
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""


async def stream_once(
    http: aiohttp.ClientSession,
    url: str,
    *,
    key: str,
    model: str,
    max_tokens: int,
    prompt: str = "hello there, tell me something",
) -> tuple[int, float, dict[str, str], bytes]:
    """One streaming chat completion; (status, seconds to the first event, headers, body)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    async with http.post(url, json=body, headers=headers) as resp:
        if resp.status != 200:
            return resp.status, math.inf, dict(resp.headers), await resp.read()
        ttft = math.inf
        async for line in resp.content:
            if line.startswith(b"data: ") and math.isinf(ttft):
                ttft = loop.time() - started
        return 200, ttft, dict(resp.headers), b""


@dataclass
class OpenLoop:
    """Poisson arrivals per (tenant, model) with a fixed seed; every outcome recorded."""

    base_url: str
    keys: dict[str, str]
    max_tokens: int
    seed: int = 7
    outcomes: list[Outcome] = field(default_factory=list)
    _tasks: set[asyncio.Task[None]] = field(default_factory=set)

    async def run(
        self,
        http: aiohttp.ClientSession,
        phase: str,
        duration_s: float,
        rates: Sequence[tuple[str, str, float]],
    ) -> None:
        """Send for ``duration_s``: each (tenant, model, requests per second) independently."""
        await asyncio.gather(
            *(
                self._stream(http, phase, duration_s, tenant, model, rate, index)
                for index, (tenant, model, rate) in enumerate(rates)
            )
        )

    async def _stream(
        self, http: aiohttp.ClientSession, phase: str, duration_s: float, tenant: str,
        model: str, rate: float, index: int,
    ) -> None:  # fmt: skip
        rng = random.Random(f"{self.seed}:{phase}:{index}")
        loop = asyncio.get_running_loop()
        start = loop.time()
        at = rng.expovariate(rate)
        while at < duration_s:
            await asyncio.sleep(max(0.0, start + at - loop.time()))
            task = asyncio.create_task(self._one(http, phase, tenant, model))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            at += rng.expovariate(rate)

    async def _one(self, http: aiohttp.ClientSession, phase: str, tenant: str, model: str) -> None:
        try:
            status, ttft, headers, body = await stream_once(
                http, f"{self.base_url}/v1/chat/completions", key=self.keys[tenant],
                model=model, max_tokens=self.max_tokens,
            )  # fmt: skip
        except (aiohttp.ClientError, TimeoutError):
            status, ttft, headers, body = 0, math.inf, {}, b""
        self.outcomes.append(Outcome(tenant, model, phase, status, ttft, headers, body))

    async def drain(self, timeout_s: float) -> None:
        """Wait (bounded) for every request sent so far."""
        if self._tasks:
            await asyncio.wait(list(self._tasks), timeout=timeout_s)
        for task in list(self._tasks):
            task.cancel()


def p95(values: Sequence[float]) -> float:
    """The 95th percentile (nearest rank); inf counts as a value (a failed request)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
