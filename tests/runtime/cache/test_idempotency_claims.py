"""An ``Idempotency-Key``'s running claim (real Redis): it lapses a bounded time after its
owner's deadline when nobody forgets it, never before the owner's deadline, and an owner
forgets only its own claim."""

from __future__ import annotations

import asyncio
import uuid

import pytest
import redis.asyncio as aioredis

from runtime.cache.entry import CachedUsage, Entry
from runtime.cache.idempotency import Hold, IdempotencyStore
from runtime.cache.sealing import Sealer
from runtime.crypto import Keyring, generate_key

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

NS = f"switchyard:test:idem-claims:{uuid.uuid4().hex[:10]}"  # deleted after each test
DIGEST = "d" * 64
MARGIN_S = 0.3  # the tests' claim margin (the router's is a minute)


def _entry() -> Entry:
    return Entry(kind="chat", id="chatcmpl-1", created=1, model="m", chunks=("hi",),
                 finish_reason="stop", usage=CachedUsage(3, 5, 8))  # fmt: skip


def _store(client: aioredis.Redis[bytes]) -> IdempotencyStore:
    sealer = Sealer(Keyring.from_spec(f"k1:{generate_key()}"))
    return IdempotencyStore(client, namespace=NS, sealer=sealer, claim_margin_s=MARGIN_S)


async def test_a_claim_nobody_forgets_lapses_after_its_owners_deadline_and_a_retry_claims_it(
    client: aioredis.Redis[bytes],
) -> None:
    store = _store(client)
    loop = asyncio.get_running_loop()
    start = loop.time()
    owner = await store.begin("acme", "dies", DIGEST, deadline=start + 0.4)
    assert isinstance(owner, Hold)
    # The owner dies here (its router killed, or Redis failing its delete): no finish runs.
    assert 0 < await client.pttl(owner.name) <= (0.4 + MARGIN_S) * 1000
    retry = await store.begin("acme", "dies", DIGEST, deadline=start + 5)
    assert isinstance(retry, Hold), "the abandoned claim blocked the retry"
    assert loop.time() >= start + 0.4  # not before the owner's deadline
    # The dead owner's delete arrives late (Redis had stalled): the retry's claim stays.
    await owner.finish(None)
    assert await client.get(retry.name) == retry.claim
    await retry.finish(_entry())
    assert await store.begin("acme", "dies", DIGEST, deadline=loop.time() + 1) == _entry()
    assert await client.pttl(retry.name) > 23 * 3600 * 1000  # an answer is kept a day


async def test_a_slow_owner_is_not_doubled_while_it_runs(client: aioredis.Redis[bytes]) -> None:
    store = _store(client)
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + 0.8
    owner = await store.begin("acme", "slow", DIGEST, deadline=deadline)
    assert isinstance(owner, Hold)
    assert await client.pttl(owner.name) >= (deadline - loop.time()) * 1000

    async def runs_to_its_deadline() -> None:  # the owner's upstream work, then its answer
        await asyncio.sleep(max(0.0, deadline - loop.time()))
        await owner.finish(_entry())

    running = asyncio.create_task(runs_to_its_deadline())
    # A retry while the owner runs waits for its answer and does not run it again.
    assert await store.begin("acme", "slow", DIGEST, deadline=start + 5) == _entry()
    await running

    # The same slow owner dying at its deadline: a retry claims only once the margin passed.
    start = loop.time()
    deadline = start + 0.8
    dead = await store.begin("acme", "slow-dies", DIGEST, deadline=deadline)
    assert isinstance(dead, Hold)
    retry = await store.begin("acme", "slow-dies", DIGEST, deadline=start + 5)
    assert isinstance(retry, Hold)
    assert loop.time() >= deadline + MARGIN_S - 0.05  # Redis' expiry: millisecond precision
