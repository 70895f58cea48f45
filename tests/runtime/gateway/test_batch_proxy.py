"""The router's Batch API route (``/v1/files*``, ``/v1/batches*``): what it refuses itself,
before anything reaches the control plane: no key, an upload over its own cap (declared, or
streamed without a length), a method it does not serve, no control plane configured or none
reachable. Forwarding itself runs end to end in
tests/integration/test_batch_api_through_router.py."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
from fixtures.net import free_port
from fixtures.router import Publisher, World, inprocess_router

pytestmark = [pytest.mark.integration, pytest.mark.asyncio]

CAP = 4096


@pytest_asyncio.fixture
async def routers(tmp_path: Path) -> AsyncIterator[tuple[str, str, str]]:
    """(router with an unreachable control plane, router without one, the tenant's key)."""
    publisher = Publisher(f"switchyard:test:gw-batch:{uuid.uuid4().hex[:8]}")
    world = World()
    world.add_tenant("acme")
    key = world.add_key("acme", "acme")
    publisher.publish(world.snapshot())
    base = publisher.router_config(tmp_path)
    unreachable = dataclasses.replace(
        base, control_plane_url=f"http://127.0.0.1:{free_port()}", internal_secret="s",
        max_upload_bytes=CAP,
    )  # fmt: skip
    try:
        async with (
            inprocess_router(unreachable) as with_cp,
            inprocess_router(
                dataclasses.replace(base, snapshot_cache_path=tmp_path / "b.json")
            ) as without_cp,
        ):
            yield with_cp, without_cp, key
    finally:
        publisher.cleanup()


def _code(resp: httpx.Response) -> tuple[int, str]:
    return resp.status_code, resp.json()["error"]["code"]


async def test_refusals_before_the_control_plane(routers: tuple[str, str, str]) -> None:
    with_cp, without_cp, key = routers
    auth = {"Authorization": f"Bearer {key}"}
    async with httpx.AsyncClient(timeout=30) as http:
        assert _code(await http.get(f"{with_cp}/v1/batches")) == (401, "missing_api_key")
        resp = await http.post(f"{with_cp}/v1/files", content=b"x" * (CAP + 1), headers=auth)
        assert _code(resp) == (413, "upload_too_large")
        assert str(CAP) in resp.json()["error"]["message"]

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
            for _ in range(8):
                yield b"y" * 1024

        resp = await http.post(f"{with_cp}/v1/files", content=chunks(), headers=auth)
        assert _code(resp) == (413, "upload_too_large")
        resp = await http.put(f"{with_cp}/v1/batches", headers=auth)
        assert _code(resp) == (405, "method_not_allowed")
        resp = await http.get(f"{with_cp}/v1/batches/batch_x", headers=auth)
        assert _code(resp) == (503, "batch_api_unavailable")  # nothing listens there
        assert "cannot reach the control plane" in resp.json()["error"]["message"]
        resp = await http.get(f"{without_cp}/v1/files", headers=auth)
        assert _code(resp) == (503, "batch_api_unavailable")
        assert "no control plane is configured" in resp.json()["error"]["message"]
