"""Helpers for the gateway tests: simulator and router processes, hand-built snapshots.

Every process is a real subprocess on a free 127.0.0.1 port (``python -m
runtime.workers.simulator`` and ``python -m runtime.gateway``, so uvloop and httptools are
what is tested), stopped by its fixture. Snapshots are built by hand (no database) and
published through ``runtime.snapshot_store`` under a prefix unique to the test module, in the
Redis database of ``REDIS_URL``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import secrets
import socket
import string
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import uvicorn

from runtime.gateway.app import create_app
from runtime.gateway.config import RouterConfig
from runtime.snapshot import (
    ApiKeySnap,
    EndpointSnap,
    ModelSnap,
    PoolSnap,
    RequestClassSnap,
    Snapshot,
    TenantLimits,
    TenantSnap,
    VersionSnap,
)
from runtime.snapshot_store import publish

REPO_ROOT = Path(__file__).resolve().parents[3]
START_TIMEOUT_S = 60.0
_ALNUM = string.ascii_letters + string.digits


def redis_url() -> str:
    return os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def http_get(url: str, *, timeout: float = 5.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def metric_value(text: str, name: str) -> float | None:
    """The value of the first sample named exactly ``name`` (labels ignored), or None."""
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        if head.split("{", 1)[0] == name:
            return float(value)
    return None


@dataclass
class Process:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.unlink(missing_ok=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def _spawn(argv: Sequence[str], *, env: dict[str, str] | None = None) -> tuple[Process, int]:
    port = free_port()
    fd, name = tempfile.mkstemp(prefix="switchyard-gw-test-", suffix=".log")
    os.close(fd)
    log = Path(name)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv, "--host", "127.0.0.1", "--port", str(port)],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
        )
    return Process(proc=proc, port=port, log=log), port


def _wait_until_up(process: Process, path: str, *, ok: Sequence[int] = (200,)) -> Process:
    give_up = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < give_up:
        if process.proc.poll() is not None:
            break
        with contextlib.suppress(OSError):
            status, _ = http_get(f"{process.base_url}{path}", timeout=1)
            if status in ok:
                return process
        time.sleep(0.1)
    process.kill()
    output = process.output()[-4000:]
    process.stop()
    raise RuntimeError(f"{path} of the process never answered; its output:\n{output}")


def start_simulator(model: str, *args: str) -> Process:
    process, _ = _spawn(
        ["runtime.workers.simulator", "--model", model, "--log-level", "WARNING", *args]
    )
    return _wait_until_up(process, "/health")


def start_router(prefix: str, var_dir: Path, **env_extra: str) -> Process:
    """A router process; returns once /healthz answers (ready or not)."""
    env = {
        **os.environ,
        "REDIS_URL": redis_url(),
        "SWITCHYARD_SNAPSHOT_PREFIX": prefix,
        "SWITCHYARD_VAR_DIR": str(var_dir),
        # Under the test prefix, so Publisher.cleanup() removes it with the snapshot keys.
        "SWITCHYARD_KEY_USAGE_HASH": f"{prefix}:apikey:last_used",
        **env_extra,
    }
    process, _ = _spawn(["runtime.gateway", "--log-level", "info"], env=env)
    return _wait_until_up(process, "/healthz")


def wait_ready(router: Process, version: int, *, timeout_s: float = 20.0) -> None:
    """Wait (bounded) until the router serves snapshot ``version`` or newer."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        status, body = http_get(f"{router.base_url}/readyz", timeout=2)
        if status == 200 and json.loads(body)["snapshot_version"] >= version:
            return
        time.sleep(0.05)
    raise AssertionError(f"router did not reach snapshot {version}:\n{router.output()[-3000:]}")


# -- snapshots ----------------------------------------------------------------------------


def new_key(prefix: str | None = None) -> tuple[str, str, str]:
    """(full key, prefix, sha256 digest) in the production format."""
    lower = string.ascii_lowercase + string.digits
    prefix = prefix or "".join(secrets.choice(lower) for _ in range(8))
    secret = "".join(secrets.choice(_ALNUM) for _ in range(40))
    key = f"sy_{prefix}_{secret}"
    return key, prefix, hashlib.sha256(key.encode()).hexdigest()


def limits(*, max_context: int = 4096, max_output: int = 512) -> TenantLimits:
    return TenantLimits(
        rpm=1000, tpm=1_000_000, max_concurrency=100,
        max_context_tokens=max_context, max_output_tokens=max_output,
    )  # fmt: skip


@dataclass
class World:
    """A hand-built snapshot under construction, with the API keys it holds."""

    tenants: dict[str, TenantSnap] = field(default_factory=dict)
    keys: dict[str, ApiKeySnap] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)  # name -> full key
    classes: dict[str, RequestClassSnap] = field(default_factory=dict)
    models: dict[str, ModelSnap] = field(default_factory=dict)
    versions: dict[int, VersionSnap] = field(default_factory=dict)
    pools: dict[str, PoolSnap] = field(default_factory=dict)
    endpoints: dict[int, EndpointSnap] = field(default_factory=dict)

    def add_class(self, name: str, *, band: int, deadline_ms: int = 60_000) -> None:
        self.classes[name] = RequestClassSnap(
            name=name, priority_band=band, ttft_slo_ms=min(1000, deadline_ms),
            deadline_ms=deadline_ms, max_queue_length=100, shed_order=band,
        )  # fmt: skip

    def add_tenant(
        self,
        slug: str,
        *,
        status: str = "active",
        classes: tuple[str, ...] = (),
        default_class: str = "",
        models: tuple[str, ...] = (),
        tenant_limits: TenantLimits | None = None,
    ) -> None:
        self.tenants[slug] = TenantSnap(
            slug=slug, name=slug.title(), status=status, weight=1.0,
            limits=tenant_limits or limits(), classes=classes, default_class=default_class,
            models=models,
        )  # fmt: skip

    def add_key(
        self,
        name: str,
        tenant: str,
        *,
        scopes: tuple[str, ...] = ("inference",),
        expires_at: float | None = None,
    ) -> str:
        key, prefix, digest = new_key()
        self.keys[prefix] = ApiKeySnap(
            prefix=prefix, digest=digest, tenant=tenant, name=name, scopes=scopes,
            expires_at=expires_at,
        )  # fmt: skip
        self.secrets[name] = key
        return key

    def add_model(
        self, name: str, version_id: int, *, task: str = "chat", max_context: int = 0
    ) -> None:
        self.models[name] = ModelSnap(name=name, task=task, versions=(version_id,))
        self.versions[version_id] = VersionSnap(
            id=version_id, model=name, label=f"v{version_id}", artifact_uri="", digest="0" * 64,
            runtime="simulator", max_context=max_context, tokenizer="", default_sampling={},
            memory_gb=1.0, tensor_parallel_size=1,
        )  # fmt: skip

    def add_endpoint(
        self, endpoint_id: int, version_id: int, base_url: str, *, state: str = "ready",
        pool: str = "cpu", capacity: int = 8,
    ) -> None:  # fmt: skip
        if pool not in self.pools:
            self.pools[pool] = PoolSnap(
                name=pool, hardware_tier="cpu", cost_per_replica_hour=0.0, min_replicas=0,
                max_replicas=4, warm_replicas=0, policies={},
            )  # fmt: skip
        self.endpoints[endpoint_id] = EndpointSnap(
            id=endpoint_id, pool=pool, version=version_id, base_url=base_url, state=state,
            capacity=capacity,
        )  # fmt: skip

    def snapshot(self) -> Snapshot:
        return Snapshot(
            version=0, created_at=time.time(), tenants=dict(self.tenants),
            api_keys=dict(self.keys), classes=dict(self.classes), models=dict(self.models),
            versions=dict(self.versions), pools=dict(self.pools),
            endpoints=dict(self.endpoints),
        )  # fmt: skip


class Publisher:
    """Publishes snapshots under one prefix and cleans the prefix up afterwards."""

    def __init__(self, prefix: str, url: str | None = None) -> None:
        self.prefix = prefix
        self.client: redis.Redis[bytes] = redis.Redis.from_url(url or redis_url())

    def publish(self, snapshot: Snapshot) -> int:
        return publish(self.client, snapshot, prefix=self.prefix).version

    def cleanup(self) -> None:
        keys = list(self.client.scan_iter(match=f"{self.prefix}:*", count=1000))
        if keys:
            self.client.delete(*keys)
        self.client.close()


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


# -- the router in this process -------------------------------------------------------------


@contextlib.asynccontextmanager
async def inprocess_router(config: RouterConfig) -> AsyncIterator[str]:
    """Serve ``create_app(config)`` with uvicorn on this event loop; yields the base URL."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(config), host="127.0.0.1", port=port, loop="none", http="httptools",
            lifespan="on", log_config=None, access_log=False,
        )
    )  # fmt: skip
    task = asyncio.create_task(server.serve())
    try:
        async with asyncio.timeout(20):
            while not server.started:
                if task.done():
                    raise RuntimeError("the in-process router stopped during start-up")
                await asyncio.sleep(0.02)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        async with asyncio.timeout(20):
            await task
