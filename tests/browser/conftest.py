"""A running platform for the browser tests: simulator + router + control plane (uvicorn),
and Debian's Chromium through Playwright (never a downloaded browser)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from browser_platform import ADAPTER, MODEL, Platform, start_web
from fixtures.router import Process, World, routers, start_simulator

from runtime.artifacts import write_manifest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


@pytest.fixture(scope="module")
def data_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Process, World, str]]:
    """A simulator and a router serving tenants acme and globex, and a LoRA adapter."""
    sim = start_simulator(MODEL, "--decode-a-ms", "5", "--max-loras", "2")
    try:
        world = World()
        world.add_class("interactive", band=0, deadline_ms=30_000)
        for slug in ("acme", "globex"):
            world.add_tenant(slug, classes=("interactive",), default_class="interactive")
            world.add_key(slug, slug)
        world.add_model(MODEL, 1)
        adapter = tmp_path_factory.mktemp("adapter")
        (adapter / "adapter_config.json").write_text("{}", encoding="utf-8")
        digest, _ = write_manifest(adapter)
        world.add_adapter(ADAPTER, 2, base_version=1, artifact_uri=adapter.as_uri(),
                          digest=digest, label="v1")  # fmt: skip
        world.add_endpoint(1, 1, sim.base_url)
        with routers(world, tmp_path_factory.mktemp("router-var")) as ([router], publisher):
            yield router, world, publisher.prefix
    finally:
        sim.stop()


@pytest.fixture
def platform(
    data_plane: tuple[Process, World, str], transactional_db: Any, tmp_path: Path, settings: Any
) -> Iterator[Platform]:
    """The control plane (uvicorn, the ASGI app with websockets) on this test's database."""
    router, world, prefix = data_plane
    # What this test writes to the database publishes snapshots; keep them away from the
    # router's hand-built one (and under the prefix the publisher cleans up).
    settings.SNAPSHOT_REDIS_PREFIX = f"{prefix}:db:snapshot"
    web = start_web(prefix, tmp_path / "var")
    try:
        yield Platform(router=router, web=web, world=world)
    finally:
        web.stop()


@pytest.fixture(autouse=True)
def _orm_beside_playwright(monkeypatch: pytest.MonkeyPatch) -> None:
    """Playwright's sync API keeps an event loop running in this thread; the test's own ORM
    calls are still synchronous (Playwright's documented workaround for Django)."""
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not shutil.which(CHROMIUM):
        pytest.skip("Debian's chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright  # noqa: PLC0415

    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()
