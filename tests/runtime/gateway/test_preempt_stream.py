"""A preempted stream whose output budget is spent ends with ``finish_reason: "length"`` at
once (no wait for a slot), its parked grant leaves the queue on release, and the stop is not
counted against the endpoint's breaker. Over a real dispatcher (hand fleet and clock); the
whole path through a router is tests/integration/test_preemption.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator

import pytest
from prometheus_client import CollectorRegistry
from test_resume_units import chat_chunk, outcomes

from runtime.gateway.migrate import MigratingStream
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Ticket
from runtime.scheduling.settings import PoolSettings
from runtime.telemetry.resume_metrics import ResumeMetrics
from runtime.testing.fleet import HandFleet
from runtime.upstream.errors import StreamBroken

pytestmark = [pytest.mark.unit, pytest.mark.asyncio]


class HandClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Live:
    """An upstream stream that yields its chunks as the test releases them; closing it from
    outside breaks the read, as aiohttp's closed response does."""

    def __init__(self, payloads: list[bytes]) -> None:
        self.endpoint_id = 1
        self.pending = list(payloads)
        self.go = asyncio.Event()
        self.closed = False
        self.done = False
        self.listener: object = "breaker"

    def set_broken_listener(self, listener: object) -> None:
        self.listener = listener

    async def events(self) -> AsyncGenerator[bytes, None]:
        while self.pending:
            await self.go.wait()
            if self.closed:
                raise StreamBroken("closed", reason="disconnected", endpoint_id=1)
            yield self.pending.pop(0)
        self.done = True

    def close(self) -> None:
        self.closed = True
        self.go.set()

    async def aclose(self) -> None:
        self.close()


def ticket(tenant: str) -> Ticket:
    return Ticket(tenant=tenant, version=1, input_tokens=10, max_output_tokens=2)


async def test_a_preempted_stream_with_its_budget_spent_ends_with_length() -> None:
    fleet = HandFleet()
    fleet.add(1, capacity=2)
    clock = HandClock()
    d = PoolDispatcher("p", PoolSettings(preemption="fair"), fleet, clock=clock, tick_s=3600.0)
    d.start()
    try:
        mine, other = await d.acquire(ticket("a")), await d.acquire(ticket("a"))
        queued = [asyncio.create_task(d.acquire(ticket("a"))) for _ in range(4)]
        await asyncio.sleep(0)
        clock.now = 10.0  # a has asked for three shares on average: it floods
        upstream = Live([chat_chunk("", role=True), chat_chunk("A"), chat_chunk("B"),
                         chat_chunk("C")])  # fmt: skip
        metrics = ResumeMetrics(CollectorRegistry())
        document = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        stream = MigratingStream(
            upstream, kind="chat", body=json.dumps(document).encode(),  # type: ignore[arg-type]
            open_next=None, limit=0, metrics=metrics, prompt_tokens=5,  # type: ignore[arg-type]
        )  # fmt: skip
        stream.preemptible_by(mine, document)
        out: list[bytes] = []
        events = stream.events()
        for _ in range(3):  # the role chunk, A, B: the budget of 2 is spent, no final chunk
            upstream.go.set()
            out.append(await events.__anext__())
            upstream.go.clear()
        arrival = await asyncio.wait_for(d.acquire(ticket("b")), 1.0)  # preempts `mine`
        assert mine.parked
        assert upstream.closed
        assert upstream.listener is None  # the stop is not the endpoint's fault
        out.extend([payload async for payload in events])
        final, usage = json.loads(out[-2]), json.loads(out[-1])
        assert final["choices"][0]["finish_reason"] == "length"
        assert usage["usage"]["completion_tokens"] == 2
        assert outcomes(metrics) == {"length": 1.0}
        waiting = len(d)
        mine.release()
        assert len(d) == waiting - 1  # its queue entry left with it
        assert d.inflight() == {"a": 1, "b": 1}
        for grant in (arrival, other):
            grant.release()
        for task in queued:
            task.cancel()
    finally:
        await d.stop()
