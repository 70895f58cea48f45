"""The fuzz suite's target: one real router process in front of two simulators (this module's
name is unique; conftest.py re-exports the fixture).

The tenant's output cap is tiny (4 tokens), so a generated request that happens to be valid
is served in milliseconds; the router's body/head timeout is 1 s, so the raw-socket corpus
sees the 408s quickly.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from fixtures.router import (
    Process,
    Publisher,
    World,
    limits,
    start_router,
    start_simulator,
    wait_ready,
)

CHAT_MODEL = "fuzz-chat"
EMBED_MODEL = "fuzz-embed"
BODY_TIMEOUT_S = 1.0


@dataclass(frozen=True)
class Target:
    router: Process
    key: str

    @property
    def base_url(self) -> str:
        return self.router.base_url

    @property
    def port(self) -> int:
        return self.router.port


@pytest.fixture(scope="session")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    publisher = Publisher(f"switchyard:test:fuzz:{uuid.uuid4().hex[:12]}")
    started: list[Process] = []
    try:
        chat = start_simulator(CHAT_MODEL, "--decode-a-ms", "1")
        started.append(chat)
        embed = start_simulator(EMBED_MODEL, "--embedding-dim", "4")
        started.append(embed)
        world = World()
        world.add_class("interactive", band=0, deadline_ms=10_000)
        world.add_tenant(
            "acme",
            classes=("interactive",),
            tenant_limits=limits(max_context=512, max_output=4),
        )
        key = world.add_key("fuzz", "acme")
        world.add_model(CHAT_MODEL, 1)
        world.add_model(EMBED_MODEL, 2, task="embedding")
        world.add_endpoint(1, 1, chat.base_url)
        world.add_endpoint(2, 2, embed.base_url)
        version = publisher.publish(world.snapshot())
        router = start_router(
            publisher.prefix,
            tmp_path_factory.mktemp("fuzz-var"),
            SWITCHYARD_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
        )
        started.append(router)
        wait_ready(router, version)
        yield Target(router=router, key=key)
    finally:
        for process in reversed(started):
            process.stop()
        publisher.cleanup()
