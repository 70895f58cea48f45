"""HTTP checks a supervisor makes against its own engine: health, warmup, requests in flight.

They speak vLLM's OpenAI-compatible server (``/health``, ``/v1/completions``, ``/metrics``),
which the simulator imitates. aiohttp only (docs/design.md); every call has a timeout.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import aiohttp

from runtime.upstream.promtext import parse_samples

IN_FLIGHT_METRICS = ("vllm:num_requests_running", "vllm:num_requests_waiting")
HEALTH_POLL_S = 0.5
_PROBE_TIMEOUT = aiohttp.ClientTimeout(total=5.0)


class EngineStartError(RuntimeError):
    """The engine did not come up: it exited, never turned healthy, or failed its warmup."""


async def wait_healthy(
    session: aiohttp.ClientSession,
    base_url: str,
    *,
    timeout_s: float,
    exited: Callable[[], int | None],
    interrupted: Callable[[], Awaitable[bool]],
) -> bool:
    """Poll ``/health`` until it answers 200; False if ``interrupted`` says to give up.

    ``exited()`` returns the engine's exit code once it has died. ``interrupted()`` sleeps up to
    one poll interval and returns True when a stop was requested meanwhile. Raises
    :class:`EngineStartError` when the engine dies or ``timeout_s`` passes first.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        code = exited()
        if code is not None:
            raise EngineStartError(f"the engine exited with code {code} before it was healthy")
        try:
            async with session.get(f"{base_url}/health", timeout=_PROBE_TIMEOUT) as resp:
                if resp.status == 200:
                    return True
        except (aiohttp.ClientError, TimeoutError):
            pass  # not listening yet
        if time.monotonic() >= deadline:
            raise EngineStartError(f"the engine was not healthy within {timeout_s:.0f} s")
        if await interrupted():
            return False


async def warm_up(
    session: aiohttp.ClientSession, base_url: str, model: str, *, timeout_s: float
) -> None:
    """One tiny completion (max_tokens 1) so the first real request meets a warm engine."""
    body = {"model": model, "prompt": "Hello", "max_tokens": 1, "temperature": 0.0}
    try:
        async with session.post(
            f"{base_url}/v1/completions",
            json=body,
            timeout=aiohttp.ClientTimeout(total=timeout_s),
        ) as resp:
            text = await resp.text()
            if resp.status != 200:
                raise EngineStartError(
                    f"the warmup completion failed with HTTP {resp.status}: {text[:500]}"
                )
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise EngineStartError(f"the warmup completion failed: {exc!r}") from exc


async def requests_in_flight(session: aiohttp.ClientSession, base_url: str) -> int | None:
    """Running + waiting requests from the engine's ``/metrics``; None if it cannot tell."""
    try:
        async with session.get(f"{base_url}/metrics", timeout=_PROBE_TIMEOUT) as resp:
            if resp.status != 200:
                return None
            text = await resp.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    samples = parse_samples(text, IN_FLIGHT_METRICS)
    if not all(name in samples for name in IN_FLIGHT_METRICS):
        return None
    return round(sum(sum(values) for values in samples.values()))
