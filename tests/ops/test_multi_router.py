"""Several routers over one Redis behave as one (issue #19 item 6, routers only): the same
snapshot version everywhere, a tenant's RPM limit enforced globally, and the survivors keep
serving when one router is killed."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import httpx
import pytest
from fixtures.router import (
    Process,
    Publisher,
    World,
    http_get,
    spawn,
    start_router,
    wait_ready,
    wait_until_up,
)
from fixtures.wait import eventually

from runtime.snapshot import TenantLimits

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

ROUTERS = 3
RPM = 12
MODEL = "sim-chat"


@pytest.fixture
def fleet(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[list[Process], World, Publisher]]:
    sim, _ = spawn(["runtime.workers.simulator", "--model", MODEL, "--log-level", "WARNING"])
    publisher = Publisher(f"sytest:ops:multi:{uuid.uuid4().hex[:12]}:snapshot")
    routers: list[Process] = []
    try:
        wait_until_up(sim, "/health")
        world = World()
        world.add_class("interactive", band=0)
        world.add_tenant(
            "acme",
            classes=("interactive",),
            default_class="interactive",
            tenant_limits=TenantLimits(
                rpm=RPM, tpm=1_000_000, max_concurrency=100, max_context_tokens=4096,
                max_output_tokens=512,
            ),
        )  # fmt: skip
        world.add_tenant("other", classes=("interactive",), default_class="interactive")
        world.add_key("acme", "acme")
        world.add_key("other", "other")
        world.add_model(MODEL, 1)
        world.add_endpoint(1, 1, sim.base_url)
        version = publisher.publish(world.snapshot())
        for number in range(ROUTERS):  # one by one: a failed start still stops the others
            router = start_router(publisher.prefix, tmp_path_factory.mktemp(f"router-{number}"))
            routers.append(router)
        for router in routers:
            wait_ready(router, version)
        yield routers, world, publisher
    finally:
        for router in routers:
            router.stop()
        sim.stop()
        publisher.cleanup()


def chat(router: Process, key: str) -> int:
    response = httpx.post(
        f"{router.base_url}/v1/chat/completions",
        json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    return response.status_code


def versions(routers: list[Process]) -> set[int]:
    return {json.loads(http_get(f"{r.base_url}/readyz")[1])["snapshot_version"] for r in routers}


def test_routers_share_snapshot_and_limits_and_survive_a_kill(
    fleet: tuple[list[Process], World, Publisher],
) -> None:
    routers, world, publisher = fleet
    acme, other = world.secrets["acme"], world.secrets["other"]

    # One global RPM limit: 3 * RPM requests spread over the routers admit RPM, not 3 * RPM.
    statuses = [chat(routers[i % ROUTERS], acme) for i in range(3 * RPM)]
    assert statuses.count(200) == RPM, statuses
    assert set(statuses) == {200, 429}
    assert all(chat(router, other) == 200 for router in routers)  # others unaffected

    # A publish reaches every router.
    new_version = publisher.publish(world.snapshot())
    eventually(lambda: versions(routers) == {new_version}, timeout=5.0, what="same version")

    routers[0].kill()
    survivors = routers[1:]
    assert all(chat(router, other) == 200 for router in survivors)
    newer = publisher.publish(world.snapshot())
    eventually(lambda: versions(survivors) == {newer}, timeout=5.0, what="survivors follow")
