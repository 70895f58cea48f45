"""Preemption at the router (issue #34) through a real router process over a vLLM simulator.

The pool has two slots and the ``preemption: fair`` policy. A flooder holds both (a long
prompt ``A`` and a short one ``B``, the cheaper to resume) with more queued; a well-behaved
tenant arrives: it is served at once, from ``B``'s slot (its stream stopped, its request
queued again); ``B`` resumes by continuation when a slot frees and its client sees one stream
(one id, one role chunk, every token once in the usage, billed once). The exits of a parked
stream settle once: its client going away while it waits, its deadline passing while it
waits. With ``resume_first`` the stopped stream takes the next slot before the flooder's
queued requests, even those due earlier.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import aiohttp
import msgspec
import pytest
import redis
from fixtures.router import (
    Process,
    Publisher,
    World,
    http_get,
    redis_url,
    routers,
    start_simulator,
    wait_ready,
)
from fixtures.wait import async_eventually
from integration_support import add_class, set_policies, tenant_limits

from runtime.metering.events import decode_event

pytestmark = [pytest.mark.integration, pytest.mark.asyncio, pytest.mark.timeout(120)]

MODEL = "preempt-chat"
B_TOKENS = 30
LONG_PROMPT = " ".join(["a long prompt that is dearer to resume"] * 20)


@dataclass
class Fleet:
    router: Process
    keys: dict[str, str]
    prefix: str
    world: World
    publisher: Publisher

    def policies(self, **policies: str) -> None:
        """Publish the pool's policies; wait (bounded) until the router serves them."""
        set_policies(self.world, "p", **policies)
        wait_ready(self.router, self.publisher.publish(self.world.snapshot()))

    def metric(self, name: str, **labels: str) -> float:
        _status, body = http_get(f"{self.router.base_url}/metrics")
        total = 0.0
        for line in body.decode().splitlines():
            head, _, value = line.rpartition(" ")
            if head.split("{", 1)[0] == name and all(f'{k}="{v}"' in head
                                                     for k, v in labels.items()):  # fmt: skip
                total += float(value)
        return total

    def usage_events(self, request_id: str) -> list[dict[str, object]]:
        client: redis.Redis[bytes] = redis.Redis.from_url(redis_url())
        try:
            raw = client.xrange(f"{self.prefix}:usage")
        finally:
            client.close()
        events = [msgspec.to_builtins(decode_event(fields[b"event"])) for _id, fields in raw]
        return [e for e in events if e["request_id"] == request_id]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    sim = start_simulator(MODEL, "--decode-a-ms", "50", "--max-num-seqs", "8")
    try:
        world = World()
        add_class(world, "standard", band=0, deadline_ms=60_000)
        add_class(world, "short", band=0, deadline_ms=2_500)
        add_class(world, "long", band=0, deadline_ms=600_000)
        world.add_model(MODEL, 1)
        world.add_endpoint(1, 1, sim.base_url, pool="p", capacity=2)
        set_policies(world, "p", saturation="inflight_only", preemption="fair")
        for tenant in ("flooder", "polite"):
            world.add_tenant(tenant, classes=("standard", "short", "long"),
                             default_class="standard",
                             tenant_limits=tenant_limits())  # fmt: skip
            world.add_key(tenant, tenant)
        with routers(world, tmp_path_factory.mktemp("preempt")) as ([router], publisher):
            yield Fleet(router, dict(world.secrets), publisher.prefix, world, publisher)
    finally:
        sim.stop()


@dataclass
class Streamed:
    """One streaming chat completion read as it arrives."""

    chunks: list[dict[str, object]] = field(default_factory=list)
    first_token_at: float | None = None
    last_at: float | None = None
    done: bool = False

    @property
    def tokens(self) -> int:
        return sum(1 for c in self.chunks for ch in c.get("choices") or []  # type: ignore[attr-defined]
                   if (ch.get("delta") or {}).get("content"))  # fmt: skip


async def stream(http: aiohttp.ClientSession, fleet: Fleet, out: Streamed, *, tenant: str,
                 request_id: str, prompt: str, max_tokens: int, klass: str = "standard",
                 ) -> None:  # fmt: skip
    loop = asyncio.get_running_loop()
    body = {"model": MODEL, "messages": [{"role": "user", "content": prompt}],
            "max_tokens": max_tokens, "stream": True, "temperature": 0,
            "stream_options": {"include_usage": True}}  # fmt: skip
    headers = {"Authorization": f"Bearer {fleet.keys[tenant]}", "X-Request-Id": request_id,
               "X-Switchyard-Class": klass}  # fmt: skip
    url = f"{fleet.router.base_url}/v1/chat/completions"
    async with http.post(url, json=body, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        async for line in resp.content:
            if not line.startswith(b"data: ") or line.strip() == b"data: [DONE]":
                continue
            out.chunks.append(json.loads(line[6:]))
            out.last_at = loop.time()
            if out.first_token_at is None and out.tokens:
                out.first_token_at = out.last_at
    out.done = True


async def until(check: Callable[[], bool], what: str) -> None:
    """Poll ``check`` (bounded)."""
    await async_eventually(check, timeout=20.0, interval=0.02, what=what)


class Scenario:
    """The flooder's A and B running, four more queued, then the polite tenant's request."""

    def __init__(self, http: aiohttp.ClientSession, fleet: Fleet, tag: str) -> None:
        self.http, self.fleet, self.tag = http, fleet, tag
        self.a, self.b, self.polite = Streamed(), Streamed(), Streamed()
        self.queued = [Streamed() for _ in range(4)]
        self.tasks: dict[str, asyncio.Task[None]] = {}

    def start(self, name: str, out: Streamed, **kwargs: object) -> None:
        self.tasks[name] = asyncio.create_task(stream(
            self.http, self.fleet, out, request_id=f"{self.tag}-{name}", **kwargs))  # type: ignore[arg-type]

    async def preempt_b(self, *, b_class: str = "standard", polite_tokens: int = 10) -> None:
        before = self.fleet.metric("switchyard_preemptions_total")
        tag = self.tag  # in every prompt: the response cache never answers another run's
        self.start("a", self.a, tenant="flooder", prompt=f"{tag} {LONG_PROMPT}", max_tokens=100)
        await until(lambda: self.a.tokens >= 1, "A streams")
        self.start("b", self.b, tenant="flooder", prompt=f"{tag} short", max_tokens=B_TOKENS,
                   klass=b_class)  # fmt: skip
        await until(lambda: self.b.tokens >= 3, "B streams")
        for n, out in enumerate(self.queued):
            self.start(f"q{n}", out, tenant="flooder", prompt=f"{tag} queued {n}",
                       max_tokens=5)  # fmt: skip
        await until(lambda: self.b.tokens >= 8, "B streams on while the rest queue")
        self.start("polite", self.polite, tenant="polite", prompt=f"{tag} hello",
                   max_tokens=polite_tokens)  # fmt: skip
        await until(lambda: self.fleet.metric("switchyard_preemptions_total") > before,
                    "a preemption")  # fmt: skip

    async def finish(self) -> None:
        await asyncio.wait_for(asyncio.gather(*self.tasks.values(), return_exceptions=True), 60)


async def test_an_arrival_takes_a_lent_slot_and_the_victim_resumes_as_one_stream(
    fleet: Fleet,
) -> None:
    resumed = fleet.metric("switchyard_stream_resumes_total", cause="preemption",
                           outcome="resumed")  # fmt: skip
    async with aiohttp.ClientSession() as http:
        run = Scenario(http, fleet, "whole")
        await run.preempt_b()
        await run.finish()
    a, b, polite = run.a, run.b, run.polite
    assert polite.done
    assert polite.first_token_at is not None
    # served at once: its first token came while both of the flooder's streams were running
    assert a.last_at is not None
    assert b.last_at is not None
    assert polite.first_token_at < min(a.last_at, b.last_at)
    assert fleet.metric("switchyard_stream_resumes_total", cause="preemption",
                        outcome="resumed") == resumed + 1  # fmt: skip
    # B: one stream, a pause and no error
    assert all("error" not in c for c in b.chunks), b.chunks[-2:]
    assert len({c["id"] for c in b.chunks}) == 1
    choices = [c["choices"][0] for c in b.chunks if c["choices"]]  # type: ignore[index]
    assert sum("role" in ch["delta"] for ch in choices) == 1
    assert b.tokens == B_TOKENS
    assert choices[-1]["finish_reason"] == "length"
    usage = b.chunks[-1]["usage"]
    assert usage["completion_tokens"] == B_TOKENS  # type: ignore[index]
    await until(lambda: len(fleet.usage_events("whole-b")) == 1, "B's usage event")
    [event] = fleet.usage_events("whole-b")
    assert event["outcome"] == "ok"
    assert event["tokens_out"] == B_TOKENS
    assert event["tokens_in"] == usage["prompt_tokens"]  # type: ignore[index]
    assert all(q.done and q.tokens == 5 for q in run.queued)


async def test_a_client_gone_while_its_stream_waits_to_resume_settles_once(
    fleet: Fleet,
) -> None:
    cancelled = fleet.metric("switchyard_stream_resumes_total", cause="preemption",
                             outcome="cancelled")  # fmt: skip
    async with aiohttp.ClientSession() as http:
        run = Scenario(http, fleet, "gone")
        await run.preempt_b(polite_tokens=40)  # B waits about 2 s for a slot
        seen = run.b.tokens
        run.tasks.pop("b").cancel()  # the client hangs up while its stream is parked
        await until(lambda: fleet.metric("switchyard_stream_resumes_total", cause="preemption",
                                         outcome="cancelled") == cancelled + 1,
                    "the parked stream's wait cancelled")  # fmt: skip
        await run.finish()
    await until(lambda: len(fleet.usage_events("gone-b")) == 1, "B's usage event")
    [event] = fleet.usage_events("gone-b")
    assert event["outcome"] == "cancelled"
    assert seen <= event["tokens_out"] < B_TOKENS  # type: ignore[operator]
    # its queue entry left with it: the flooder's queued requests all ran
    assert all(q.done and q.tokens == 5 for q in run.queued)


async def test_a_deadline_passing_while_the_stream_waits_ends_it_and_settles_once(
    fleet: Fleet,
) -> None:
    async with aiohttp.ClientSession() as http:
        run = Scenario(http, fleet, "late")
        await run.preempt_b(b_class="short", polite_tokens=60)  # 3 s: past B's 2.5-s deadline
        await run.finish()
    b = run.b
    assert b.done
    assert b.chunks[-1]["choices"][0]["finish_reason"] == "error"  # type: ignore[index]
    assert b.chunks[-1]["error"]["code"] == "deadline_exceeded"  # type: ignore[index]
    assert b.tokens < B_TOKENS
    await until(lambda: len(fleet.usage_events("late-b")) == 1, "B's usage event")
    [event] = fleet.usage_events("late-b")
    assert event["outcome"] == "error"
    assert b.tokens <= event["tokens_out"] < B_TOKENS  # type: ignore[operator]
    assert fleet.metric("switchyard_stream_resumes_total", cause="preemption",
                        outcome="deadline") >= 1  # fmt: skip


async def test_with_resume_first_the_stopped_stream_goes_before_the_queued_requests(
    fleet: Fleet,
) -> None:
    # B's class is due last (600 s): by its deadline alone the four queued requests (60 s)
    # would take the slot the polite request frees before B resumed
    fleet.policies(saturation="inflight_only", preemption="fair", resume_first="on")
    try:
        async with aiohttp.ClientSession() as http:
            run = Scenario(http, fleet, "first")
            await run.preempt_b(b_class="long")
            await run.finish()
    finally:
        fleet.policies(saturation="inflight_only", preemption="fair")
    b = run.b
    assert b.done
    assert b.tokens == B_TOKENS
    assert all("error" not in c for c in b.chunks), b.chunks[-2:]
    assert all(q.done and q.tokens == 5 for q in run.queued)
    # no queued request began before B had all its tokens: B resumed on the freed slot first
    assert b.last_at is not None
    assert all(q.first_token_at is not None and q.first_token_at > b.last_at
               for q in run.queued)  # fmt: skip
