"""Router-side coalescing: grouping by key, size cap, window and deadline flushes, per-request
replies and error isolation, and fairness across tenants decided before coalescing (the real
PoolDispatcher grants the slots; the coalescer only groups what was granted).
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable, Sequence

import msgspec
import pytest
from fixtures.wait import async_eventually

from runtime.batching.coalescer import (
    CoalescePolicy,
    Coalescer,
    Member,
    Reply,
    split_batch_reply,
)
from runtime.routing.prefix import PromptPrefix
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Ticket
from runtime.scheduling.interfaces import EndpointLoad
from runtime.scheduling.settings import PoolSettings
from runtime.snapshot import EndpointSnap

pytestmark = pytest.mark.unit


class Upstream:
    """A fake batch endpoint: echoes each body; a body ``"bad"`` gets a 400 of its own."""

    def __init__(self, *, fail: BaseException | None = None) -> None:
        self.calls: list[tuple[Hashable, list[bytes]]] = []
        self.fail = fail
        self.release = asyncio.Event()
        self.release.set()

    async def __call__(self, key: Hashable, members: Sequence[Member]) -> list[Reply]:
        self.calls.append((key, [m.body for m in members]))
        await self.release.wait()
        if self.fail is not None:
            raise self.fail
        return [Reply(400, b"{}") if m.body == b'"bad"' else Reply(200, m.body) for m in members]


def member(body: bytes, deadline_in: float = 30.0) -> Member:
    return Member(body=body, deadline=asyncio.get_running_loop().time() + deadline_in)


@pytest.mark.asyncio
async def test_compatible_requests_within_the_window_share_one_call():
    upstream = Upstream()
    coalescer = Coalescer(upstream, CoalescePolicy(window_s=0.05, max_batch=16))
    replies = await asyncio.gather(
        *(coalescer.submit(("e1", 1, "/v1/embeddings"), member(b"%d" % i)) for i in range(5))
    )
    assert [r.body for r in replies] == [b"0", b"1", b"2", b"3", b"4"]
    assert len(upstream.calls) == 1
    assert coalescer.calls == 1


@pytest.mark.asyncio
async def test_incompatible_requests_go_in_separate_calls():
    upstream = Upstream()
    coalescer = Coalescer(upstream, CoalescePolicy(window_s=0.05, max_batch=16))
    await asyncio.gather(
        coalescer.submit(("e1", 1, "/v1/embeddings"), member(b"1")),
        coalescer.submit(("e1", 2, "/v1/embeddings"), member(b"2")),  # another version
        coalescer.submit(("e1", 1, "/v1/classifications"), member(b"3")),  # another route
        coalescer.submit(("e2", 1, "/v1/embeddings"), member(b"4")),  # another endpoint
    )
    assert sorted(len(bodies) for _, bodies in upstream.calls) == [1, 1, 1, 1]


@pytest.mark.asyncio
async def test_size_cap_flushes_without_waiting_for_the_window():
    upstream = Upstream()
    coalescer = Coalescer(upstream, CoalescePolicy(window_s=60.0, max_batch=3))
    replies = await asyncio.wait_for(
        asyncio.gather(*(coalescer.submit("k", member(b"%d" % i)) for i in range(6))), timeout=5
    )
    assert len(replies) == 6
    assert [len(bodies) for _, bodies in upstream.calls] == [3, 3]


@pytest.mark.asyncio
async def test_an_early_deadline_flushes_before_the_window():
    upstream = Upstream()
    coalescer = Coalescer(upstream, CoalescePolicy(window_s=60.0, max_batch=64, margin_s=0.0))
    reply = await asyncio.wait_for(coalescer.submit("k", member(b"1", deadline_in=0.05)), 5)
    assert reply.body == b"1"


@pytest.mark.asyncio
async def test_one_bad_request_does_not_fail_its_neighbours():
    upstream = Upstream()
    coalescer = Coalescer(upstream, CoalescePolicy(window_s=0.05, max_batch=16))
    replies = await asyncio.gather(
        coalescer.submit("k", member(b"1")),
        coalescer.submit("k", member(b'"bad"')),
        coalescer.submit("k", member(b"3")),
    )
    assert [r.status for r in replies] == [200, 400, 200]
    assert len(upstream.calls) == 1


@pytest.mark.asyncio
async def test_a_transport_failure_reaches_every_member():
    upstream = Upstream(fail=ConnectionError("reset"))
    coalescer = Coalescer(upstream, CoalescePolicy(window_s=0.01, max_batch=16))
    results = await asyncio.gather(
        coalescer.submit("k", member(b"1")),
        coalescer.submit("k", member(b"2")),
        return_exceptions=True,
    )
    assert all(isinstance(r, ConnectionError) for r in results)


@pytest.mark.asyncio
async def test_a_cancelled_member_leaves_the_call_to_its_neighbours():
    upstream = Upstream()
    upstream.release.clear()
    coalescer = Coalescer(upstream, CoalescePolicy(window_s=0.01, max_batch=16))
    first = asyncio.ensure_future(coalescer.submit("k", member(b"1")))
    second = asyncio.ensure_future(coalescer.submit("k", member(b"2")))
    await async_eventually(lambda: upstream.calls, timeout=5, what="the shared call started")
    first.cancel()
    upstream.release.set()
    assert (await asyncio.wait_for(second, 5)).body == b"2"
    assert first.cancelled()


def test_split_batch_reply_keeps_order_and_refuses_a_short_answer():
    payload = {"responses": [{"status": 200, "body": {"a": 1}}, {"status": 400, "body": {}}]}
    replies = split_batch_reply(payload, 2)
    assert [(r.status, msgspec.json.decode(r.body)) for r in replies] == [
        (200, {"a": 1}),
        (400, {}),
    ]
    with pytest.raises(ValueError, match="one response per request"):
        split_batch_reply(payload, 3)
    with pytest.raises(ValueError, match="no status"):
        split_batch_reply({"responses": [{"body": {}}]}, 1)


class OneEndpoint:
    """The dispatcher's Placement protocol over one endpoint of ``capacity`` slots."""

    def __init__(self, capacity: int) -> None:
        self.endpoint = EndpointSnap(
            id=1, pool="p", version=1, base_url="http://enc", state="ready", capacity=capacity
        )
        self.inflight = 0

    def candidates(self, version: int, exclude: frozenset[int]) -> Sequence[EndpointSnap]:
        return [] if 1 in exclude else [self.endpoint]

    def load(self, endpoint: EndpointSnap) -> tuple[int, EndpointLoad]:
        return self.inflight, EndpointLoad()

    def choose(
        self,
        endpoints: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        adapter: str | None = None,
        prefix: PromptPrefix | None = None,
    ) -> EndpointSnap:
        return endpoints[0]

    def adapter_room(
        self,
        version: int,
        roomy: Sequence[EndpointSnap],
        adapter: str,
        *,
        waited_s: float,
        typical_wait_s: float,
    ) -> Sequence[EndpointSnap]:
        return roomy

    def fallback(
        self,
        version: int,
        exclude: frozenset[int],
        affinity_key: str | None,
        *,
        prefix: PromptPrefix | None = None,
    ) -> EndpointSnap | None:
        return None if 1 in exclude else self.endpoint

    def capacity(self) -> int:
        return self.endpoint.capacity

    def acquire(self, endpoint_id: int) -> None:
        self.inflight += 1

    def release(self, endpoint_id: int) -> None:
        self.inflight -= 1


@pytest.mark.asyncio
async def test_two_tenants_flooding_share_the_encoder_fairly():
    """Tenant a queues 30 requests before tenant b queues 30: the scheduler interleaves them
    (fair share per request, before coalescing), so the coalesced calls carry both tenants
    evenly from the start rather than a's backlog first."""
    loop = asyncio.get_running_loop()
    placement = OneEndpoint(capacity=4)
    dispatcher = PoolDispatcher(
        "p",
        PoolSettings(),
        placement,
        clock=loop.time,
        tick_s=0.01,  # type: ignore[arg-type]
    )
    dispatcher.start()
    served: list[str] = []

    async def send(key: Hashable, members: Sequence[Member]) -> list[Reply]:
        await asyncio.sleep(0.002)  # the upstream's compute time
        served.extend(m.body.decode() for m in members)
        return [Reply(200, m.body) for m in members]

    coalescer = Coalescer(send, CoalescePolicy(window_s=0.005, max_batch=4))

    async def request(tenant: str) -> None:
        ticket = Ticket(
            tenant=tenant, version=1, input_tokens=10, max_output_tokens=0, band=0,
            class_name="standard", shed_order=0, weight=1.0, deadline=loop.time() + 30,
        )  # fmt: skip
        grant = await dispatcher.acquire(ticket)
        try:
            assert grant.endpoint is not None
            await coalescer.submit((grant.endpoint, 1, "/v1/embeddings"), member(tenant.encode()))
        finally:
            grant.release()

    try:
        tasks = [loop.create_task(request("a")) for _ in range(30)]
        await asyncio.sleep(0)
        tasks += [loop.create_task(request("b")) for _ in range(30)]
        await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)
    finally:
        await dispatcher.stop()
    first_half = served[:30]
    assert len(served) == 60
    assert 10 <= first_half.count("b") <= 20, served
    assert coalescer.calls < 60  # requests were coalesced
