"""The gateway tests' simulator fleet: simulator processes, the standard world, and fixtures.

The router and snapshot helpers these tests share with the end-to-end tests live in
``tests/fixtures/router.py`` (``fixtures.router``); they are re-exported here, so the gateway
tests import everything from ``gateway_fleet``.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.router import (
    Process,
    Publisher,
    World,
    free_port,
    http_get,
    inprocess_router,
    limits,
    metric_value,
    new_key,
    redis_url,
    start_router,
    start_simulator,
    wait_ready,
)

from runtime.artifacts import write_manifest

__all__ = [
    "CHAT_MODEL",
    "EMBED_MODEL",
    "GHOST_MODEL",
    "ORPHAN_MODEL",
    "SLOW_MODEL",
    "Fleet",
    "Process",
    "Publisher",
    "World",
    "adapter_folder",
    "fleet",
    "free_port",
    "http_get",
    "inprocess_router",
    "limits",
    "metric_value",
    "new_key",
    "publisher",
    "redis_url",
    "standard_world",
    "start_router",
    "start_simulator",
    "var_dir",
    "wait_ready",
]


def adapter_folder(root: Path, name: str) -> tuple[str, str]:
    """A stand-in LoRA adapter folder (the simulator checks only that it exists): its file
    URI and manifest digest."""
    folder = root / name
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"name": name}), encoding="utf-8")
    digest, _ = write_manifest(folder)
    return folder.as_uri(), digest


@pytest.fixture(scope="module")
def publisher() -> Iterator[Publisher]:
    pub = Publisher(f"switchyard:test:gateway:{uuid.uuid4().hex[:12]}")
    yield pub
    pub.cleanup()


@pytest.fixture(scope="module")
def var_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("router-var")


# -- the standard fleet -------------------------------------------------------------------

CHAT_MODEL = "sim-chat"
EMBED_MODEL = "sim-embed"
SLOW_MODEL = "slow-chat"
GHOST_MODEL = "ghost-chat"  # its only endpoint is a closed port
ORPHAN_MODEL = "orphan-chat"  # no endpoint at all


@dataclass
class Fleet:
    router: Process
    sims: dict[str, Process]
    world: World
    publisher: Publisher
    var_dir: Path

    def key(self, name: str) -> str:
        return self.world.secrets[name]

    @property
    def base_url(self) -> str:
        return self.router.base_url

    def republish(self) -> int:
        version = self.publisher.publish(self.world.snapshot())
        wait_ready(self.router, version)
        return version

    def stop(self) -> None:
        self.router.stop()
        for sim in self.sims.values():
            sim.stop()
        self.publisher.cleanup()


def standard_world(sims: dict[str, Process], closed_port: int) -> World:
    world = World()
    world.add_class("interactive", band=0, deadline_ms=30_000)
    world.add_class("batch", band=2, deadline_ms=120_000)
    world.add_class("secret-class", band=1)
    world.add_tenant("acme", classes=("interactive", "batch"), default_class="interactive")
    world.add_tenant("frozen", status="suspended", classes=("interactive",))
    world.add_tenant("narrow", models=(EMBED_MODEL,))
    world.add_tenant("tiny", tenant_limits=limits(max_context=64, max_output=16))
    world.add_tenant("roomy", tenant_limits=limits(max_context=1_000_000, max_output=512))
    world.add_key("good", "acme")
    world.add_key("expired", "acme", expires_at=time.time() - 60)
    world.add_key("frozen", "frozen")
    world.add_key("narrow", "narrow")
    world.add_key("tiny", "tiny")
    world.add_key("roomy", "roomy")
    world.add_key("readonly", "acme", scopes=("read",))
    world.add_model(CHAT_MODEL, 1)
    world.add_model(EMBED_MODEL, 2, task="embedding")
    world.add_model(SLOW_MODEL, 3)
    world.add_model(GHOST_MODEL, 4)
    world.add_model(ORPHAN_MODEL, 5)
    world.add_endpoint(1, 1, sims["chat-a"].base_url)
    world.add_endpoint(2, 1, sims["chat-b"].base_url)
    world.add_endpoint(3, 2, sims["embed"].base_url)
    world.add_endpoint(4, 3, sims["slow"].base_url)
    world.add_endpoint(5, 4, f"http://127.0.0.1:{closed_port}")
    return world


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """Router + simulators + the standard world, shared by the gateway tests (read-only)."""
    sims: dict[str, Process] = {}
    publisher = Publisher(f"switchyard:test:gateway:{uuid.uuid4().hex[:12]}")
    router: Process | None = None
    try:
        sims["chat-a"] = start_simulator(CHAT_MODEL, "--decode-a-ms", "2")
        sims["chat-b"] = start_simulator(CHAT_MODEL, "--decode-a-ms", "2")
        sims["embed"] = start_simulator(EMBED_MODEL, "--embedding-dim", "16")
        # 20 prompt tokens per second: a 400-character prompt takes ~5 s to its first token.
        sims["slow"] = start_simulator(SLOW_MODEL, "--prefill-tps", "20")
        world = standard_world(sims, free_port())
        version = publisher.publish(world.snapshot())
        var_dir = tmp_path_factory.mktemp("fleet-var")
        router = start_router(publisher.prefix, var_dir)
        wait_ready(router, version)
    except BaseException:
        if router is not None:
            router.stop()
        for sim in sims.values():
            sim.stop()
        publisher.cleanup()
        raise
    fleet = Fleet(router=router, sims=sims, world=world, publisher=publisher, var_dir=var_dir)
    yield fleet
    fleet.stop()
