"""Real parts for rollout tests: artifact folders that verify, simulator replicas, and a user's
chat request through a router, with the version that served it."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from django.db import connections
from fixtures import router
from fixtures.router import Process

from apps.rollouts.models import Rollout
from runtime.artifacts import compute_manifest

MODEL = "tiny-llama"


def artifact(root: Path, content: bytes = b"weights") -> dict[str, Any]:
    """A local artifact folder: ``model_version_create`` keywords (uri, digest, manifest)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "model.safetensors").write_bytes(content)
    digest, files = compute_manifest(root)
    manifest = {"tokenizer": "tok", "max_context": 2048, "default_sampling": {}, "files": files}
    return {"artifact_uri": root.as_uri(), "digest": digest, "manifest": manifest}


def start_simulator(*args: str, model: str = MODEL) -> Process:
    return router.start_simulator(model, "--decode-a-ms", "2", *args)


@dataclass
class Sent:
    tenant: str
    at: float  # unix time the request was sent
    status: int  # 0: no answer (connection error or timeout)
    version: str  # the x-switchyard-version header, "" when absent


async def send_one(
    http: aiohttp.ClientSession, router: Process, keys: Mapping[str, str], tenant: str
) -> Sent:
    """One short chat request to MODEL as ``tenant`` (its key in ``keys``)."""
    at = time.time()
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    headers = {"Authorization": f"Bearer {keys[tenant]}"}
    try:
        async with http.post(
            f"{router.base_url}/v1/chat/completions", json=body, headers=headers
        ) as resp:
            await resp.read()
            return Sent(tenant, at, resp.status, resp.headers.get("x-switchyard-version", ""))
    except (aiohttp.ClientError, TimeoutError):
        return Sent(tenant, at, 0, "")


def answers(base_url: str) -> bool:
    """Whether a replica at ``base_url`` answers its /health with 200 now."""
    try:
        with urllib.request.urlopen(f"{base_url}/health", timeout=2) as resp:
            return bool(resp.status == 200)
    except OSError:
        return False


async def traffic_until(
    router: Process,
    keys: Mapping[str, str],
    tenants: Sequence[str],
    watch: Callable[[], Awaitable[None]],
    *,
    tail_s: float,
    users: int = 4,
) -> list[Sent]:
    """Requests from every tenant in turn (``users`` in flight) until ``watch()`` returns, then
    ``tail_s`` more; everything sent."""
    sent: list[Sent] = []
    done_at: list[float] = []

    async def user(index: int) -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as http:
            i = index
            while not done_at or time.monotonic() < done_at[0] + tail_s:
                sent.append(await send_one(http, router, keys, tenants[i % len(tenants)]))
                i += users

    async def watcher() -> None:
        try:
            await watch()
        finally:
            done_at.append(time.monotonic())

    await asyncio.gather(watcher(), *(user(i) for i in range(users)))
    return sent


def rollout_state(pk: int) -> str:
    """The rollout's state as the database has it now (from any thread)."""
    try:
        return Rollout.objects.values_list("state", flat=True).get(pk=pk)
    finally:
        connections.close_all()
