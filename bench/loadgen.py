"""The open-loop load generator: send a phase's schedule on time, record what came back.

Arrival times come from the schedule (``bench.workload``) and never wait for a response, so
a slow target faces a growing backlog, as it would in production. Each request records its
send lag (how late the generator was: if that grows, the client machine is the bottleneck and
the report says so), status, time to first token, the gaps between tokens, tokens, and an
error kind. A phase is bounded: requests past their timeout are cut, and whatever is still in
flight ``drain_timeout_s`` after the last send is cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from array import array
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import aiohttp
import msgspec

from bench.workload import PhasePlan, Planned, chat_messages

CHAT_PATH = "/v1/chat/completions"


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    delta: _Delta | None = None
    text: str | None = None


class _Usage(msgspec.Struct):
    completion_tokens: int = 0


class _Chunk(msgspec.Struct):
    choices: list[_Choice] = []
    usage: _Usage | None = None
    error: msgspec.Raw | None = None


_CHUNK = msgspec.json.Decoder(_Chunk)


@dataclass(slots=True)
class Result:
    """What happened to one planned request. Times are seconds from the phase start."""

    planned: Planned
    sent: float = 0.0
    status: int = 0  # 0: no HTTP response
    ttft: float | None = None  # first content token (streams) or the whole answer (unary)
    end: float = 0.0
    tokens: int = 0
    gaps: array[float] = field(default_factory=lambda: array("d"))
    error: str = ""  # "" = success

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def lag(self) -> float:
        return self.sent - self.planned.at


def classify_status(status: int) -> str:
    if status == 429:
        return "rejected_429"
    if status == 402:
        return "rejected_402"
    if status == 503:
        return "unavailable_503"
    if 400 <= status < 500:
        return f"client_{status}"
    return f"server_{status}"


def request_body(planned: Planned, model: str) -> bytes:
    doc: dict[str, object] = {
        "model": model,
        "messages": chat_messages(planned),
        "max_tokens": planned.max_tokens,
        "temperature": 1.0,
        "stream": planned.stream,
    }
    if planned.stream:
        doc["stream_options"] = {"include_usage": True}
    return msgspec.json.encode(doc)


async def _read_stream(resp: aiohttp.ClientResponse, result: Result, t0: float) -> None:
    last = 0.0
    async for raw in resp.content:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        payload = line[5:].strip()
        if payload == b"[DONE]":
            return
        now = time.perf_counter() - t0
        try:
            chunk = _CHUNK.decode(payload)
        except msgspec.DecodeError:
            result.error = "bad_chunk"
            return
        if chunk.error is not None:
            result.error = "stream_error"
            return
        if chunk.usage is not None and not chunk.choices:
            result.tokens = max(result.tokens, chunk.usage.completion_tokens)
            continue
        choice = chunk.choices[0] if chunk.choices else None
        text = (choice.delta.content if choice.delta else choice.text) if choice else None
        if not text:
            continue
        if result.ttft is None:
            result.ttft = now
        else:
            result.gaps.append(now - last)
        last = now
        result.tokens += 1
    result.error = "stream_cut"  # the body ended without [DONE]


async def send_one(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: Mapping[str, str],
    result: Result,
    *,
    origin: float,
    timeout_s: float,
) -> None:
    """Send one request and fill ``result`` (never raises but for cancellation)."""
    t0 = time.perf_counter()
    result.sent = t0 - origin
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=body, headers=headers) as resp:
                result.status = resp.status
                if resp.status != 200:
                    await resp.read()
                    result.error = classify_status(resp.status)
                elif result.planned.stream:
                    await _read_stream(resp, result, t0)
                else:
                    payload = await resp.read()
                    result.ttft = time.perf_counter() - t0
                    usage = _CHUNK.decode(payload).usage
                    result.tokens = usage.completion_tokens if usage else 0
    except TimeoutError:
        result.error = "timeout"
    except asyncio.CancelledError:
        result.error = "cancelled_at_drain"
        raise
    except aiohttp.ClientConnectionError:
        result.error = "connection"
    except (aiohttp.ClientError, msgspec.DecodeError):
        result.error = "protocol"
    finally:
        result.end = time.perf_counter() - origin


@dataclass
class PhaseRun:
    results: list[Result]
    wall_s: float  # first send to last completion
    cancelled: int  # in flight at the drain deadline
    gc_pauses_ms: tuple[float, ...] = ()  # this process's collections during the phase


class GcPauses:
    """This process's garbage-collection pauses while entered, in ms.

    Entering collects once and freezes what exists (the imports, the plan, the bodies, the
    targets' objects) into the permanent generation, so a collection during the phase walks
    only what the phase made: a full collection of a load generator's ~130,000 start-up
    objects takes ~50 ms, a pause in which no request is sent on time (the phase's send lag,
    which voids the phase when it grows). Exiting unfreezes them."""

    def __init__(self) -> None:
        self.pauses_ms: list[float] = []
        self._started = 0.0

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses_ms.append(1000.0 * (time.perf_counter() - self._started))

    def __enter__(self) -> GcPauses:
        gc.collect()
        gc.freeze()
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)
        gc.unfreeze()


HeadersFor = Callable[[Planned], Mapping[str, str]]


async def run_phase(
    session: aiohttp.ClientSession,
    plan: PhasePlan,
    *,
    base_urls: Sequence[str],
    headers_for: HeadersFor,
    model: str,
    timeout_s: float,
    drain_timeout_s: float,
) -> PhaseRun:
    """Send ``plan`` open-loop, round-robin over ``base_urls``; wait (bounded) for the tail."""
    results = [Result(planned=p) for p in plan.requests]
    bodies = [request_body(p, model) for p in plan.requests]
    urls = [f"{u.rstrip('/')}{CHAT_PATH}" for u in base_urls]
    with GcPauses() as pauses:
        cancelled = await _send_all(
            session, results, bodies, urls, headers_for,
            timeout_s=timeout_s, drain_timeout_s=drain_timeout_s,
        )  # fmt: skip
    for result in results:
        if result.sent == 0 and not result.error:  # cancelled before it could start
            result.error = "cancelled_at_drain"
    end = max((r.end for r in results), default=0.0)
    return PhaseRun(results=results, wall_s=end, cancelled=cancelled,
                    gc_pauses_ms=tuple(pauses.pauses_ms))  # fmt: skip


async def _send_all(
    session: aiohttp.ClientSession,
    results: Sequence[Result],
    bodies: Sequence[bytes],
    urls: Sequence[str],
    headers_for: HeadersFor,
    *,
    timeout_s: float,
    drain_timeout_s: float,
) -> int:
    """Send each of ``results``' requests at its time; wait (bounded) for the tail; return
    how many were still in flight at the drain deadline (cancelled)."""
    tasks: set[asyncio.Task[None]] = set()
    loop = asyncio.get_running_loop()
    origin = time.perf_counter()
    behind = 0
    for i, result in enumerate(results):
        delay = result.planned.at - (time.perf_counter() - origin)
        if delay > 0:
            behind = 0
            await asyncio.sleep(delay)
        elif (behind := behind + 1) % 32 == 0:
            await asyncio.sleep(0)  # late: still let responses be read
        task = loop.create_task(
            send_one(
                session,
                urls[i % len(urls)],
                bodies[i],
                headers_for(result.planned),
                result,
                origin=origin,
                timeout_s=timeout_s,
            )
        )
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    cancelled = 0
    if tasks:
        _, pending = await asyncio.wait(set(tasks), timeout=drain_timeout_s)
        cancelled = len(pending)
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError):
                await task
    return cancelled
