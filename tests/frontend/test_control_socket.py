"""The staff feed over the dashboard websocket: control documents (rollouts, scaling, queued
actions) reach operators, live and on connect, and never a tenant's user.

Real Redis (channel layer, the latest control document) and PostgreSQL (what it reads); the
relay runs with the real control source.
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
from fixtures.router import redis_url
from fixtures.wait import async_eventually
from test_live_socket import _connect, _doc

from apps.models.services import pool_create
from apps.scaling.models import ScalingDecision
from frontend.control_feed import ControlSource
from frontend.relay import LiveRelay
from runtime.telemetry.live import live_channel

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]


def _decision() -> None:
    pool = pool_create(actor=None, name="feed-cpu", hardware_tier="cpu", cost_per_replica_hour=1)
    ScalingDecision.objects.create(
        pool=pool, policy="cpu", actuator="local", action="out", current=1, desired=2,
        reason="utilisation 0.93 above 0.8", signals={"pool": "feed-cpu", "inflight": 14},
    )  # fmt: skip


async def _next_control(communicator: WebsocketCommunicator) -> dict[str, Any]:
    for _ in range(20):  # bounded: skip anything else that arrives
        message = await communicator.receive_json_from(timeout=5)
        if message["type"] == "control":
            return dict(message["doc"])
    raise AssertionError("no control document")


@pytest.mark.asyncio
async def test_control_documents_reach_staff_only(namespace: str, people: dict[str, User]) -> None:
    await database_sync_to_async(_decision)()
    control = ControlSource(redis_url(), namespace)
    relay = LiveRelay(redis_url(), namespace, control=control)
    sockets: dict[str, WebsocketCommunicator] = {}
    try:
        for name, query in (("staff", ""), ("alice", ""), ("bob", "tenant=globex")):
            communicator, (connected, _) = await _connect(people[name], query)
            assert connected, name
            assert (await communicator.receive_json_from(timeout=5))["type"] == "backfill"
            sockets[name] = communicator
        await relay.start()
        document = await _next_control(sockets["staff"])
        (pool,) = document["scaling"]
        assert pool["pool"] == "feed-cpu"
        assert pool["decisions"][0]["reason"] == "utilisation 0.93 above 0.8"
        assert pool["decisions"][0]["signals"] == "inflight 14"
        assert [p[1:] for p in pool["history"]] == [[1, 2]]  # actual, desired
        assert document["rollouts"] == []
        assert document["tasks"] == []
        await _next_control(sockets["staff"])  # and again a second later
        assert relay.controls >= 2
        for name in ("alice", "bob"):  # tenant users: nothing (no live documents either)
            assert await sockets[name].receive_nothing(timeout=0.5), name
        # a page that connects now gets the latest at once; a tenant's does not
        late, (connected, _) = await _connect(people["staff"])
        assert connected
        sockets["late"] = late
        assert (await late.receive_json_from(timeout=5))["type"] == "backfill"
        assert (await late.receive_json_from(timeout=5))["type"] == "control"
        alice, (connected, _) = await _connect(people["alice"])
        assert connected
        sockets["alice-late"] = alice
        assert (await alice.receive_json_from(timeout=5))["type"] == "backfill"
        assert await alice.receive_nothing(timeout=0.5)
    finally:
        for communicator in sockets.values():
            await communicator.disconnect()
        await relay.stop()
        control.close()


@pytest.mark.asyncio
async def test_a_failing_control_read_does_not_stop_live_documents(
    namespace: str, people: dict[str, User]
) -> None:
    calls: list[float] = []

    async def broken() -> dict[str, Any]:  # e.g. the database is down
        calls.append(time.time())
        raise RuntimeError("database unavailable")

    relay = LiveRelay(redis_url(), namespace, control=broken)
    publisher = aioredis.Redis.from_url(redis_url())
    staff, (connected, _) = await _connect(people["staff"])
    try:
        assert connected
        assert (await staff.receive_json_from(timeout=5))["type"] == "backfill"
        await relay.start()

        async def forwarded_after_failures() -> bool:
            await publisher.publish(live_channel(namespace), msgspec.json.encode(_doc(time.time())))
            return len(calls) >= 2 and relay.forwarded > 0

        await async_eventually(forwarded_after_failures, timeout=15.0, what="failures, then docs")
        assert relay.controls == 0
        message = await staff.receive_json_from(timeout=5)
        assert message["type"] == "live"  # never a control document
    finally:
        await staff.disconnect()
        await relay.stop()
        await publisher.aclose()
