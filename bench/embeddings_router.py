"""The router in front of the encoder worker, for ``bench.embeddings --via-router``.

One hand-built snapshot (:mod:`runtime.testing.snapshots`: one tenant with a generated key and
no practical limits, the encoder as a ``torch`` embedding version, the worker as one ready
endpoint) is published to Redis under a prefix unique to the run, and ``python -m
runtime.gateway`` serves it. :meth:`RouterFront.stop` stops the router and deletes the run's keys.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

from runtime.snapshot_store import publish
from runtime.testing.snapshots import SnapshotBuilder, limits

BIG = 1_000_000_000
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class RouterFront:
    proc: subprocess.Popen[bytes]
    base_url: str
    key: str
    prefix: str
    redis_url: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        client: redis.Redis[bytes] = redis.Redis.from_url(self.redis_url)
        try:
            keys = list(client.scan_iter(match=f"{self.prefix}:*", count=500))
            if keys:
                client.delete(*keys)
        finally:
            client.close()


def start_router(
    worker_url: str, *, model: str, artifact_dir: Path, redis_url: str, port: int, log: Path,
    capacity: int = 512, timeout_s: float = 120.0,
) -> RouterFront:  # fmt: skip
    """Publish the one-endpoint snapshot and start the router on ``port`` (ready: /readyz)."""
    prefix = f"bench:embeddings:{uuid.uuid4().hex[:8]}"
    world = SnapshotBuilder()
    world.add_tenant(
        "bench",
        tenant_limits=limits(rpm=BIG, tpm=BIG, max_concurrency=BIG, max_context=BIG),
        models=(model,),
    )
    key = world.add_key("bench", "bench")
    world.add_model(
        model, 1, task="embedding", max_context=512, runtime="torch",
        artifact_uri=artifact_dir.as_uri(),
    )  # fmt: skip
    world.add_endpoint(1, 1, worker_url, pool="encoder", capacity=capacity)
    client: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
    try:
        publish(client, world.snapshot(), prefix=f"{prefix}:snapshot")
    finally:
        client.close()
    var = log.parent / "router-var"
    var.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "REDIS_URL": redis_url,
        "SWITCHYARD_SNAPSHOT_PREFIX": f"{prefix}:snapshot",
        "SWITCHYARD_VAR_DIR": str(var),
        "SWITCHYARD_KEY_USAGE_HASH": f"{prefix}:apikey:last_used",
        "SWITCHYARD_LIMITS_PREFIX": f"{prefix}:limits",
        "SWITCHYARD_FAIRNESS_PREFIX": f"{prefix}:fairness",
    }
    argv = [sys.executable, "-m", "runtime.gateway", "--host", "127.0.0.1", "--port", str(port),
            "--log-level", "WARNING", "--graceful-shutdown-s", "2"]  # fmt: skip
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603
    front = RouterFront(proc, f"http://127.0.0.1:{port}", key, prefix, redis_url)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            front.stop()
            raise RuntimeError(f"the router exited during start-up; see {log}")
        try:
            with urllib.request.urlopen(f"{front.base_url}/readyz", timeout=2) as resp:  # noqa: S310
                if resp.status == 200:
                    return front
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    front.stop()
    raise RuntimeError(f"the router was not ready within {timeout_s:.0f} s; see {log}")
