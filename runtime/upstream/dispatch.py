"""One request, several endpoints: retry before the first byte, within the deadline.

``pick`` is the router's choice (filters + scorers), called with the ids to leave out: those
already tried for this request and those whose breaker refused. A failure before the first
byte that is retryable (connect refused or timed out, connection dropped, no first byte
within the TTFT cap, 5xx, 429) is recorded on the endpoint's breaker and retried on another
endpoint after an exponential backoff with full jitter, never sleeping past the deadline.
A 4xx is the client's and goes back at once. An opened response is a success on the
endpoint's breaker (its book passes that on as passive health evidence, see ``health.py``).
After the first byte nothing is retried; the returned response reports a broken stream to
the endpoint's breaker.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Mapping

from runtime.snapshot import EndpointSnap
from runtime.upstream.breaker import BreakerBook
from runtime.upstream.client import UpstreamClient
from runtime.upstream.errors import (
    DeadlineExceeded,
    NoEndpointAvailable,
    UpstreamError,
)
from runtime.upstream.response import UpstreamResponse

Picker = Callable[[frozenset[int]], EndpointSnap | None]

_MAX_PICKS = 1024  # bounds the skip-refused-breaker loop even with a misbehaving picker


def backoff_delay(retry: int, *, base: float, cap: float, rng: random.Random) -> float:
    """Full-jitter exponential backoff before retry number ``retry`` (1-based)."""
    return rng.uniform(0.0, min(cap, base * 2.0 ** (retry - 1)))


async def open_with_retry(
    pick: Picker,
    client: UpstreamClient,
    breakers: BreakerBook,
    path: str,
    body: bytes,
    *,
    deadline: float,
    rng: random.Random,
    max_attempts: int = 3,
    backoff_base: float = 0.025,
    backoff_cap: float = 1.0,
    headers: Mapping[str, str] | None = None,
    first_byte_cap: float | None = None,
) -> tuple[EndpointSnap, UpstreamResponse]:
    """Open the request on the first endpoint that answers; see the module docstring.

    Raises DeadlineExceeded, NoEndpointAvailable (nothing left to try; ``__cause__`` is the
    last failure if any), a non-retryable UpstreamHTTPError (4xx) at once, or the last
    failure when ``max_attempts`` are spent.
    """
    if max_attempts < 1:
        raise ValueError("max_attempts must be >= 1")
    loop = asyncio.get_running_loop()
    excluded: set[int] = set()
    last_error: UpstreamError | None = None
    for attempt in range(max_attempts):
        if attempt:
            delay = backoff_delay(attempt, base=backoff_base, cap=backoff_cap, rng=rng)
            if loop.time() + delay >= deadline:
                raise DeadlineExceeded("deadline passed while retrying") from last_error
            await asyncio.sleep(delay)
        endpoint = _acquire(pick, breakers, excluded)
        if endpoint is None:
            raise NoEndpointAvailable("no endpoint left to try") from last_error
        excluded.add(endpoint.id)
        breaker = breakers.get(endpoint.id)
        try:
            response = await client.open_stream(
                endpoint,
                path,
                body,
                deadline=deadline,
                headers=headers,
                first_byte_cap=first_byte_cap,
            )
        except UpstreamError as exc:
            if exc.endpoint_fault:
                breaker.record_failure()
            else:
                breaker.release()
            if not exc.retryable:
                raise
            last_error = exc
            continue
        except BaseException:
            breaker.release()  # cancelled: no verdict on the endpoint
            raise
        breaker.record_success()
        response.set_broken_listener(breaker.stream_listener)
        return endpoint, response
    assert last_error is not None
    raise last_error


def _acquire(pick: Picker, breakers: BreakerBook, excluded: set[int]) -> EndpointSnap | None:
    for _ in range(_MAX_PICKS):
        endpoint = pick(frozenset(excluded))
        if endpoint is None or endpoint.id in excluded:
            return None
        if breakers.get(endpoint.id).try_acquire():
            return endpoint
        excluded.add(endpoint.id)
    return None
