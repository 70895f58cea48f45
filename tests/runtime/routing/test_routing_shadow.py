"""The shadow mirror: when it copies a request, where to, and that it drops instead of queueing
once its own slot cap is used up (copies go to a real in-process HTTP server)."""

from __future__ import annotations

import asyncio
import random

import msgspec
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer
from fixtures.wait import async_eventually
from routing_support import endpoint, snapshot

from runtime.routing.shadow import ShadowMirror
from runtime.snapshot import Snapshot
from runtime.telemetry.versions import VersionStats
from runtime.upstream.drain import DrainClient

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]


def shadow_world(base_url: str, share: float = 1.0) -> Snapshot:
    base = snapshot(
        versions=(1, 2),
        splits=((1, 100),),
        endpoints=(endpoint(10, 1), msgspec.structs.replace(endpoint(20, 2), base_url=base_url)),
    )
    route = msgspec.structs.replace(base.routes["m"], shadow_version=2, shadow_share=share)
    return msgspec.structs.replace(base, routes={"m": route})


async def test_copies_go_to_the_candidate_and_drop_past_the_cap() -> None:
    seen: list[bytes] = []
    release = asyncio.Event()

    async def handler(request: web.Request) -> web.Response:
        seen.append(await request.read())
        await release.wait()
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    mirror = ShadowMirror(max_inflight=2, rng=random.Random(0))
    await mirror.start()
    try:
        snap = shadow_world(f"http://127.0.0.1:{server.port}")
        model, stable, candidate = snap.models["m"], snap.versions[1], snap.versions[2]
        path = "/v1/chat/completions"
        assert not mirror.offer(snap, model, candidate, path, b"{}")  # served by the candidate
        offers = [mirror.offer(snap, model, stable, path, b'{"n": %d}' % i) for i in range(5)]
        assert offers == [True, True, False, False, False]  # cap 2: the rest are dropped
        assert (mirror.sent, mirror.dropped, mirror.inflight) == (2, 3, 2)
        async with asyncio.timeout(5):
            while len(seen) < 2:  # noqa: ASYNC110 - polls the server's record
                await asyncio.sleep(0.01)
        assert sorted(seen) == [b'{"n": 0}', b'{"n": 1}']
        release.set()
        async with asyncio.timeout(5):
            while mirror.inflight:  # noqa: ASYNC110 - polls the mirror's tasks
                await asyncio.sleep(0.01)
    finally:
        release.set()
        await mirror.stop()
        await server.close()


async def test_no_shadow_route_or_zero_share_copies_nothing() -> None:
    mirror = ShadowMirror(rng=random.Random(0))
    await mirror.start()
    try:
        plain = snapshot(versions=(1, 2), splits=((1, 100),))
        zero = shadow_world("http://127.0.0.1:9", share=0.0)
        for snap in (plain, zero):
            assert not mirror.offer(snap, snap.models["m"], snap.versions[1], "/x", b"{}")
        assert mirror.sent == 0
    finally:
        await mirror.stop()


async def test_copies_go_through_an_injected_client_the_mirror_does_not_close() -> None:
    seen: list[bytes] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(await request.read())
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    client = DrainClient(timeout_s=5.0)
    mirror = ShadowMirror(rng=random.Random(0), client=client)
    try:
        await mirror.start()
        snap = shadow_world(f"http://127.0.0.1:{server.port}")
        path = "/v1/chat/completions"
        assert mirror.offer(snap, snap.models["m"], snap.versions[1], path, b'{"n": 1}')
        await async_eventually(lambda: mirror.inflight == 0, timeout=5.0, what="mirror idle")
        assert seen == [b'{"n": 1}']
        await mirror.stop()
        answer = await client.post(f"http://127.0.0.1:{server.port}{path}", b"{}")  # still open
        assert answer.status == 200
    finally:
        await mirror.stop()
        await client.close()
        await server.close()


async def test_a_copy_counts_ttft_when_streamed_and_end_to_end_when_unary() -> None:
    """Issue #33: a unary copy's first byte is its whole answer, so it is timed end to end
    (the rollout gates' e2e histogram), never as a TTFT."""

    async def handler(request: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", handler)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    stats = VersionStats("redis://127.0.0.1:9", namespace="ns")  # counts in memory, no flush
    mirror = ShadowMirror(rng=random.Random(0), stats=stats)
    try:
        await mirror.start()
        snap = shadow_world(f"http://127.0.0.1:{server.port}")
        kinds: dict[bool, set[str]] = {}
        for streaming in (False, True):
            assert mirror.offer(snap, snap.models["m"], snap.versions[1],
                                "/v1/chat/completions", b"{}", streaming=streaming)  # fmt: skip
            await async_eventually(lambda: mirror.inflight == 0, timeout=5.0, what="copy done")
            pending = stats.pending_fields()  # what the next flush would write
            kinds[streaming] = {name.split(":")[0] for c in pending.values() for name in c}
            stats._pending.clear()
        assert kinds[False] >= {"n", "e2e"}
        assert "ttft" not in kinds[False]
        assert kinds[True] >= {"n", "ttft"}
        assert "e2e" not in kinds[True]
    finally:
        await mirror.stop()
        await server.close()
