"""An engine that restarts at the same URL has lost its LoRA adapters: a real router and a
real simulator process, killed and started again on the same port. The router forgets the
replica's residency when its heartbeat names a new engine start (``started``), and an engine
404 for an adapter the router still believed resident reloads it and sends the request once
more, so the client never sees the 404."""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator

import openai
import pytest
import redis
from fixtures.router import spawn, wait_until_up
from fixtures.wait import eventually
from gateway_fleet import (
    Process,
    Publisher,
    World,
    adapter_folder,
    http_get,
    redis_url,
    start_router,
    start_simulator,
)
from gateway_fleet import wait_ready as router_ready

from runtime.contract import endpoint_heartbeat_key

pytestmark = pytest.mark.integration

BASE = "lora3-base"
ADAPTER = f"{BASE}-a@v1"
HI = [{"role": "user", "content": "hi"}]
EID = 36011  # an endpoint id no other test's heartbeat uses
SIM_FLAGS = ("--max-loras", "2", "--lora-load-ms", "20")


def loaded(sim: Process) -> set[str]:
    body = json.loads(http_get(f"{sim.base_url}/v1/models")[1])
    return {m["id"] for m in body["data"] if m.get("parent")}


def metric(router: Process, name: str) -> float:
    text = http_get(f"{router.base_url}/metrics")[1].decode()
    found = re.search(rf'^{name}{{endpoint="{EID}"}} ([0-9.e+]+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else -1.0


def restart(sim: Process) -> Process:
    """Kill the simulator and start a fresh one on the same port (nothing loaded)."""
    sim.kill()
    sim.stop()
    argv = ["runtime.workers.simulator", "--model", BASE, "--log-level", "WARNING", *SIM_FLAGS]
    fresh, _ = spawn(argv, port=sim.port)
    return wait_until_up(fresh, "/health")


def beat(started: float, adapters: list[str]) -> None:
    """The replica's heartbeat as its worker writes it."""
    value = {"endpoint": EID, "state": "ready", "pid": 1, "started": started, "adapters": adapters}
    client = redis.Redis.from_url(redis_url())
    try:
        client.set(endpoint_heartbeat_key(EID), json.dumps(value), px=60_000)
    finally:
        client.close()


class Rig:
    def __init__(self, router: Process, sim: Process, key: str) -> None:
        self.router, self.sim, self.key = router, sim, key

    def ask(self) -> str:
        client = openai.OpenAI(
            base_url=f"{self.router.base_url}/v1", api_key=self.key, max_retries=0, timeout=30
        )
        answer = client.chat.completions.create(model=f"{BASE}-a", messages=HI, max_tokens=2)
        return answer.model

    def ask_once_healthy(self) -> str:
        """Ask; a 503 "none is ready" (the router's health check saw the engine down while it
        restarted) is retried until the check sees it up again (bounded). Any other error,
        a 404 included, is the answer."""
        answers: list[str] = []

        def answered() -> bool:
            try:
                answers.append(self.ask())
            except openai.InternalServerError as exc:
                if "none is ready" not in str(exc):
                    raise
                return False
            return True

        eventually(answered, timeout=20, what="the router sees the restarted engine healthy")
        return answers[-1]


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    publisher = Publisher(f"switchyard:test:lora3:{uuid.uuid4().hex[:12]}")
    root = tmp_path_factory.mktemp("adapters3")
    started: list[Process] = []
    holder: Rig | None = None
    try:
        sim = start_simulator(BASE, *SIM_FLAGS)
        started.append(sim)
        world = World()
        world.add_tenant("acme")
        world.add_key("good", "acme")
        world.add_model(BASE, 1)
        uri, digest = adapter_folder(root, "a")
        world.add_adapter(
            f"{BASE}-a", 2, base_version=1, artifact_uri=uri, digest=digest, label="v1"
        )
        world.add_endpoint(EID, 1, sim.base_url)
        version = publisher.publish(world.snapshot())
        router = start_router(publisher.prefix, tmp_path_factory.mktemp("lora3-var"))
        started.append(router)
        router_ready(router, version)
        holder = Rig(router, sim, world.secrets["good"])
        yield holder
    finally:
        if holder is not None:
            started[0] = holder.sim  # the one running now (the first was killed)
        for process in reversed(started):
            process.stop()
        client = redis.Redis.from_url(redis_url())
        client.delete(endpoint_heartbeat_key(EID))
        client.close()
        publisher.cleanup()


def test_a_404_from_a_restarted_engine_reloads_the_adapter_and_sends_again(rig: Rig) -> None:
    assert rig.ask() == ADAPTER
    assert ADAPTER in loaded(rig.sim)
    rig.sim = restart(rig.sim)  # no heartbeat tells the router: it still believes it resident
    assert loaded(rig.sim) == set()
    assert rig.ask_once_healthy() == ADAPTER  # the engine's 404 was not the answer
    assert ADAPTER in loaded(rig.sim)
    assert metric(rig.router, "switchyard_adapter_loads_total") == 2  # loaded again, once


def test_a_new_engine_start_in_the_heartbeat_drops_the_residency(rig: Rig) -> None:
    rig.ask()
    # Another router loaded b there too; the router learns it from the heartbeat.
    beat(1000.0, [ADAPTER, f"{BASE}-b@v1"])
    wait_for_resident(rig.router, 2)
    rig.sim = restart(rig.sim)
    beat(2000.0, [])  # the worker's supervisor started a fresh engine
    wait_for_resident(rig.router, 0)  # a blind router would still count both resident
    assert rig.ask_once_healthy() == ADAPTER
    assert metric(rig.router, "switchyard_adapter_loads_total") == 1  # a fresh book: no 404


def wait_for_resident(router: Process, count: int) -> None:
    eventually(
        lambda: metric(router, "switchyard_adapter_resident") == count,
        timeout=10,
        what=f"the router counts {count} adapters resident from the heartbeat",
    )
