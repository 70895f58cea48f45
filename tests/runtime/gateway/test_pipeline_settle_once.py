"""Every exit path of the inference pipeline settles exactly once (issue #27).

A real router state (``build_state`` + ``start``: real RedisLimits, dispatchers, cache front,
upstream client) over real simulators; each request runs the route's own code
(:func:`runtime.gateway.inference.serve`) with a recording client sink in place of the ASGI
consumer. Recording wrappers (they call through) count the limits' settle, each grant's
release and the cache job's finish; for every exit path (an error before admission, a limit
refusal, a queue refusal, an upstream error, a client gone mid-stream, a cache hit, an
idempotent replay, the router's shutdown cut, a normal stream, a normal unary answer) each
is called exactly as often as the path acquired it: once, or never. An ``Idempotency-Key``
whose first request died holding its claim: the retry runs once the claim lapsed, billed once.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import pytest_asyncio
from fixtures.wait import async_eventually
from gateway_fleet import Process, Publisher, World, limits, start_simulator

from runtime.cache.idempotency import Hold
from runtime.gateway.config import RouterConfig
from runtime.gateway.inference import ChatCompletionsConsumer, serve
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.state import RouterState, build_state
from runtime.scheduling.grant import Grant
from runtime.telemetry.logging import RequestRecord

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

OK, ERR, SLOW, NOWHERE = "so-chat", "so-err", "so-slow", "so-nowhere"


@dataclass
class Sims:
    ok: Process
    err: Process
    slow: Process


@pytest.fixture(scope="module")
def sims() -> Iterator[Sims]:
    started: list[Process] = []
    try:
        started.append(start_simulator(OK, "--decode-a-ms", "1"))
        started.append(start_simulator(ERR, "--error-rate", "1.0"))
        started.append(start_simulator(SLOW, "--decode-a-ms", "40"))
        yield Sims(*started)
    finally:
        for sim in started:
            sim.stop()


def world_for(sims: Sims) -> World:
    world = World()
    world.add_tenant("acme")
    world.add_tenant("tight", tenant_limits=limits(rpm=1))
    world.add_key("acme", "acme")
    world.add_key("tight", "tight")
    world.add_model(OK, 1, digest="sha256:" + "5" * 64)
    world.add_model(ERR, 2)
    world.add_model(SLOW, 3)
    world.add_model(NOWHERE, 4)  # no endpoint: the queue stage refuses it
    world.add_endpoint(1, 1, sims.ok.base_url)
    world.add_endpoint(2, 2, sims.err.base_url)
    world.add_endpoint(3, 3, sims.slow.base_url)
    return world


@dataclass
class Calls:
    """Calls per object (by identity): the limits' settle per lease, grant release, finish."""

    settle: Counter[int] = field(default_factory=Counter)
    release: Counter[int] = field(default_factory=Counter)
    finish: Counter[int] = field(default_factory=Counter)
    kept: list[object] = field(default_factory=list)  # alive: no id is reused

    def count(self, counter: Counter[int], obj: object) -> None:
        self.kept.append(obj)
        counter[id(obj)] += 1

    def totals(self) -> tuple[int, int, int]:
        return sum(self.settle.values()), sum(self.release.values()), sum(self.finish.values())


@dataclass
class Router:
    state: RouterState
    world: World
    calls: Calls


@pytest_asyncio.fixture
async def router(
    sims: Sims, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Router]:
    publisher = Publisher(f"switchyard:test:settle-once:{uuid.uuid4().hex[:8]}")
    world = world_for(sims)
    version = publisher.publish(world.snapshot())
    config: RouterConfig = publisher.router_config(tmp_path)
    state = build_state(config)
    calls = Calls()
    settle, finish, release = state.limits.settle, state.cache.finish, Grant.release

    def recording_settle(lease: Any, **kwargs: Any) -> None:
        calls.count(calls.settle, lease)
        settle(lease, **kwargs)

    async def recording_finish(job: Any, **kwargs: Any) -> None:
        calls.count(calls.finish, job)
        await finish(job, **kwargs)

    def recording_release(grant: Grant) -> None:
        calls.count(calls.release, grant)
        release(grant)

    monkeypatch.setattr(state.limits, "settle", recording_settle)
    monkeypatch.setattr(state.cache, "finish", recording_finish)
    monkeypatch.setattr(Grant, "release", recording_release)
    await state.start()
    try:
        await async_eventually(lambda: state.loader.version == version, timeout=10,
                               what="the snapshot")  # fmt: skip
        yield Router(state=state, world=world, calls=calls)
    finally:
        await state.stop()
        publisher.cleanup()


class Client:
    """The client side of one request: what it was sent; it may go away, or the router may
    cut it, after ``stop_after`` body chunks."""

    def __init__(self, stop_after: int | None = None, cut: str | None = None) -> None:
        self.status = 0
        self.chunks: list[bytes] = []
        self.ended = False
        self.stop_after = stop_after
        self.cut_with = cut
        self.cut_reason: str | None = None

    async def start_response(self, status: int, headers: Iterable[tuple[bytes, bytes]]) -> None:
        self.status = status

    async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
        self.chunks.append(data)
        self.ended = self.ended or last
        if self.stop_after is not None and len(self.chunks) >= self.stop_after:
            self.stop_after = None
            self.cut_reason = self.cut_with  # None: the client went away
            task = asyncio.current_task()
            assert task is not None
            task.cancel()
            await asyncio.sleep(0)


async def request(
    router: Router, body: dict[str, Any], *, key: str = "acme", client: Client | None = None,
    headers: dict[bytes, bytes] | None = None,
) -> tuple[Client, RequestRecord, BaseException | None]:  # fmt: skip
    client = client or Client()
    secret = router.world.secrets[key]
    sent = {b"authorization": f"Bearer {secret}".encode(), **(headers or {})}
    record = RequestRecord(request_id=uuid.uuid4().hex, route="/v1/chat/completions")
    cut: Callable[[], str | None] = lambda: client.cut_reason  # noqa: E731
    ctx = RequestContext(
        spec=ChatCompletionsConsumer.spec, request_id=record.request_id,
        body=msgspec.json.encode(body), headers=sent.get, raw_headers=list(sent.items()),
        client=client, cut=cut, record=record,
    )  # fmt: skip
    state = router.state
    task = asyncio.create_task(
        serve(ctx, pipeline=state.pipeline, account=state.account, tracing=state.tracing)
    )
    error: BaseException | None = None
    try:
        await task
    except BaseException as exc:
        error = exc
    return client, record, error


def chat(
    model: str = OK, *, stream: bool = False, max_tokens: int = 4, **extra: Any
) -> dict[str, Any]:
    messages = [{"role": "user", "content": f"hi {uuid.uuid4().hex[:8]}"}]
    return {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": stream,
            **extra}  # fmt: skip


async def test_every_exit_path_settles_exactly_once(router: Router) -> None:
    calls = router.calls
    seen: dict[str, tuple[int, int, int]] = {}

    async def path(name: str, *args: Any, **kwargs: Any) -> tuple[Client, RequestRecord]:
        before = calls.totals()
        client, record, _error = await request(router, *args, **kwargs)
        after = calls.totals()
        seen[name] = (after[0] - before[0], after[1] - before[1], after[2] - before[2])
        return client, record

    # (settle, grant release, cache finish) each path must have run, exactly.
    _, record = await path("error before admission", chat("no-such-model"))
    assert record.outcome == "model_not_found"
    await path("limit refusal (first)", chat(), key="tight")
    _, record = await path("limit refusal", chat(), key="tight")
    assert record.outcome == "rate_limit_exceeded"
    _, record = await path("queue refusal", chat(NOWHERE))
    assert record.outcome == "no_healthy_endpoint"
    _, record = await path("upstream error", chat(ERR))
    assert record.status >= 500, record
    client, record = await path("client gone mid-stream", chat(SLOW, stream=True, max_tokens=200),
                                client=Client(stop_after=3))  # fmt: skip
    assert record.outcome == "client_disconnected"
    assert not client.ended
    client, record = await path("shutdown cut", chat(SLOW, stream=True, max_tokens=200),
                                client=Client(stop_after=3, cut="router_shutdown"))  # fmt: skip
    assert record.outcome == "router_shutdown"
    assert client.ended
    assert b"router_shutdown" in client.chunks[-1]
    _, record = await path("normal stream", chat(stream=True))
    assert record.outcome == "ok"
    _, record = await path("normal unary", chat())
    assert record.outcome == "ok"
    cached = chat(temperature=0)
    await path("cache miss", cached)
    client, _ = await path("cache hit", cached)
    assert any(b"content" in chunk for chunk in client.chunks)
    key = {b"idempotency-key": uuid.uuid4().hex.encode()}
    first = chat()
    await path("idempotent first", first, headers=key)
    client, record = await path("idempotent replay", first, headers=key)
    assert record.outcome == "ok"
    assert client.status == 200

    assert seen == {
        "error before admission": (0, 0, 0),
        "limit refusal (first)": (1, 1, 1),
        "limit refusal": (0, 0, 1),
        "queue refusal": (1, 0, 1),
        "upstream error": (1, 1, 1),
        "client gone mid-stream": (1, 1, 1),
        "shutdown cut": (1, 1, 1),
        "normal stream": (1, 1, 1),
        "normal unary": (1, 1, 1),
        "cache miss": (1, 1, 1),
        "cache hit": (1, 0, 1),
        "idempotent first": (1, 1, 1),
        "idempotent replay": (0, 0, 1),
    }
    # Exactly once per lease, grant and job: never twice (early and again at exit).
    assert set(calls.settle.values()) == {1}
    assert set(calls.release.values()) == {1}
    assert set(calls.finish.values()) == {1}


async def test_the_slot_is_settled_before_the_last_chunk(router: Router) -> None:
    """The settle ran when the client received the response's last chunk."""
    settled_at_end: list[int] = []

    class Watching(Client):
        async def send_chunk(self, data: bytes, *, last: bool = False) -> None:
            if last:
                settled_at_end.append(sum(router.calls.settle.values()))
            await super().send_chunk(data, last=last)

    for stream in (True, False):
        _, record, error = await request(router, chat(stream=stream), client=Watching())
        assert error is None
        assert record.outcome == "ok"
    assert settled_at_end == [1, 2]


async def test_a_retry_after_an_abandoned_claim_lapsed_runs_afresh_billed_once(
    router: Router, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first request with a key dies before it records or forgets its claim (its router
    killed); a retry waiting on the claim runs once the claim lapsed after the first's
    deadline, and is billed once."""
    idempotency = router.state.cache.idempotency
    monkeypatch.setattr(idempotency, "claim_margin_ms", 500)
    finish = Hold.finish
    abandoned: list[Hold] = []

    async def dies_first(hold: Hold, entry: Any) -> None:
        if not abandoned:
            abandoned.append(hold)  # the first owner never gets to finish
            return
        await finish(hold, entry)

    monkeypatch.setattr(Hold, "finish", dies_first)
    key = {b"idempotency-key": uuid.uuid4().hex.encode()}
    body = chat()
    _, first, _ = await request(router, body, headers={**key, b"x-request-timeout": b"1"})
    assert first.outcome == "ok"
    assert 0 < await idempotency.redis.pttl(abandoned[0].name) <= 1500
    billed = router.calls.totals()[0]
    _, retry, error = await request(router, body, headers={**key, b"x-request-timeout": b"10"})
    assert error is None
    assert retry.outcome == "ok", retry.outcome  # not idempotency_key_in_progress
    assert router.calls.totals()[0] == billed + 1
    # the retry's answer, unbilled
    client, replay, _ = await request(router, body, headers={**key, b"x-request-timeout": b"2"})
    assert replay.outcome == "ok"
    assert client.status == 200
    assert router.calls.totals()[0] == billed + 1
