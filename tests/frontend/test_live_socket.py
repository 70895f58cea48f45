"""The dashboard websocket through Channels' communicator: auth, filtering, backfill, relay.

Real Redis (channel layer, backlog, pub/sub) and PostgreSQL (users, sessions, memberships).
"""

from __future__ import annotations

import time
from typing import Any

import msgspec
import pytest
import redis.asyncio as aioredis
from channels.db import database_sync_to_async
from channels.testing import WebsocketCommunicator
from django.contrib.auth.models import User
from django.test import Client
from fixtures.router import redis_url
from fixtures.wait import async_eventually

from config.asgi import application
from frontend.relay import LiveRelay
from runtime.telemetry.live import live_backlog, live_channel

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _doc(ts: float, *tenants: str, router: str = "r1") -> dict[str, Any]:
    return {
        "v": 1,
        "router": router,
        "ts": ts,
        "interval_s": 1.0,
        "rows": [{"tenant": t, "model": "m", "requests": 1} for t in tenants],
        "pools": [
            {
                "pool": "p",
                "queued": {"0": 1},
                "served_share": dict.fromkeys(tenants, 0.5),
                "entitled_share": {},
                "jain": 1.0,
            }
        ],
        "endpoints": [{"id": 1, "pool": "p", "inflight": 1, "capacity": 4}],
        "classes": {"interactive": {"band": 0, "ttft_slo_ms": 500}},
    }


async def _connect(user: User | None, query: str = "") -> tuple[WebsocketCommunicator, Any]:
    headers = [(b"origin", b"http://127.0.0.1")]
    if user is not None:
        headers.append((b"cookie", await database_sync_to_async(_session_cookie)(user)))
    path = "/ws/live/" + (f"?{query}" if query else "")
    communicator = WebsocketCommunicator(application, path, headers=headers)
    connected, code = await communicator.connect(timeout=5)
    return communicator, (connected, code)


def _session_cookie(user: User) -> bytes:
    client = Client()
    client.force_login(user)
    return f"sessionid={client.cookies['sessionid'].value}".encode()


async def _refused(communicator: WebsocketCommunicator, result: Any) -> int:
    """The close code of a refused socket; fails if anything was sent before the close."""
    assert result == (True, None)
    output = await communicator.receive_output(timeout=5)
    assert output["type"] == "websocket.close", output
    return int(output["code"])


async def _seed_backlog(namespace: str, *docs: dict[str, Any]) -> None:
    client = aioredis.Redis.from_url(redis_url())
    for doc in docs:  # LPUSH: the newest ends first, as the routers write it
        await client.lpush(live_backlog(namespace), msgspec.json.encode(doc))
    await client.aclose()


@pytest.mark.asyncio
async def test_anonymous_is_refused(namespace: str, people: dict[str, User]) -> None:
    assert await _refused(*await _connect(None)) == 4401


@pytest.mark.asyncio
async def test_user_without_tenant_is_refused(namespace: str, people: dict[str, User]) -> None:
    assert await _refused(*await _connect(people["nobody"])) == 4403


@pytest.mark.asyncio
async def test_forged_tenant_in_query_is_refused(namespace: str, people: dict[str, User]) -> None:
    assert await _refused(*await _connect(people["alice"], "tenant=globex")) == 4403


@pytest.mark.asyncio
async def test_forged_subscription_message_is_refused(
    namespace: str, people: dict[str, User]
) -> None:
    communicator, (connected, _) = await _connect(people["alice"])
    assert connected
    assert (await communicator.receive_json_from(timeout=5))["type"] == "backfill"
    await communicator.send_json_to({"subscribe": "globex"})
    assert await communicator.receive_json_from(timeout=5) == {
        "type": "error",
        "error": "forbidden",
    }
    assert (await communicator.receive_output(timeout=5))["code"] == 4403
    await communicator.disconnect()


@pytest.mark.asyncio
async def test_backfill_is_recent_oldest_first_and_filtered(
    namespace: str, people: dict[str, User]
) -> None:
    now = time.time()
    await _seed_backlog(
        namespace, _doc(now - 900, "acme"), _doc(now - 2, "acme", "globex"), _doc(now - 1, "globex")
    )
    staff, (connected, _) = await _connect(people["staff"])
    assert connected
    backfill = await staff.receive_json_from(timeout=5)
    assert [d["ts"] for d in backfill["docs"]] == [now - 2, now - 1]  # 15-minute-old one dropped
    assert backfill["docs"][0]["endpoints"]  # staff see the fleet
    await staff.disconnect()

    alice, (connected, _) = await _connect(people["alice"])
    assert connected
    docs = (await alice.receive_json_from(timeout=5))["docs"]
    assert [[r["tenant"] for r in d["rows"]] for d in docs] == [["acme"], []]
    assert all(d["pools"] == [] and d["endpoints"] == [] for d in docs)
    await alice.disconnect()


@pytest.mark.asyncio
async def test_relay_fans_live_documents_out_filtered(
    namespace: str, people: dict[str, User]
) -> None:
    relay = LiveRelay(redis_url(), namespace)
    await relay.start()
    publisher = aioredis.Redis.from_url(redis_url())
    sockets: dict[str, WebsocketCommunicator] = {}
    try:
        for name, query in (
            ("staff", ""),
            ("alice", ""),
            ("bob", "tenant=globex"),
            ("staff-acme", "tenant=acme"),
        ):
            user = people[name.split("-")[0]]
            communicator, (connected, _) = await _connect(user, query)
            assert connected, name
            assert (await communicator.receive_json_from(timeout=5))["type"] == "backfill"
            sockets[name] = communicator

        async def published() -> bool:  # until the relay holds the lease and listens
            await publisher.publish(
                live_channel(namespace), msgspec.json.encode(_doc(time.time(), "acme", "globex"))
            )
            return relay.forwarded > 0

        await async_eventually(published, timeout=10.0, what="the relay forwards a document")
        seen = {}
        for name, communicator in sockets.items():
            message = await communicator.receive_json_from(timeout=5)
            assert message["type"] == "live"
            seen[name] = sorted(r["tenant"] for r in message["doc"]["rows"])
        assert seen == {
            "staff": ["acme", "globex"],
            "alice": ["acme"],
            "bob": ["globex"],
            "staff-acme": ["acme"],
        }
    finally:
        for communicator in sockets.values():
            await communicator.disconnect()
        await relay.stop()
        await publisher.aclose()


@pytest.mark.asyncio
async def test_one_relay_forwards_and_another_takes_over(
    namespace: str, people: dict[str, User]
) -> None:
    relays = [LiveRelay(redis_url(), namespace), LiveRelay(redis_url(), namespace)]
    for relay in relays:
        await relay.start()
    publisher = aioredis.Redis.from_url(redis_url())
    staff, (connected, _) = await _connect(people["staff"])
    assert connected
    assert (await staff.receive_json_from(timeout=5))["type"] == "backfill"

    async def publish_until(relay_forwarded: Any) -> None:
        async def tick() -> bool:
            await publisher.publish(live_channel(namespace), msgspec.json.encode(_doc(time.time())))
            return bool(relay_forwarded())

        await async_eventually(tick, timeout=20.0, what="a relay forwards")

    try:
        await publish_until(lambda: sum(r.forwarded for r in relays))
        holders = [r for r in relays if r.forwarded]
        assert len(holders) == 1  # the lease: never both
        marker = _doc(time.time(), "acme", router="marker")
        await publisher.publish(live_channel(namespace), msgspec.json.encode(marker))
        routers: list[str] = []
        for _ in range(200):  # warm-up documents may still be on the way (bounded)
            routers.append((await staff.receive_json_from(timeout=10))["doc"]["router"])
            if routers[-1] == "marker":
                break
        while len(routers) < 400 and not await staff.receive_nothing(timeout=1.0):
            routers.append((await staff.receive_json_from(timeout=10))["doc"]["router"])
        assert routers.count("marker") == 1  # exactly once
        # the holder stops; the other relay takes the lease over
        (holder,) = holders
        (standby,) = [r for r in relays if r is not holder]
        await holder.stop()
        await publish_until(lambda: standby.forwarded)
    finally:
        await staff.disconnect()
        for relay in relays:
            await relay.stop()
        await publisher.aclose()
