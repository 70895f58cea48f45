"""Streams that wait long in the queue, behind a proxy that cuts idle connections (issue #33).

``python -m bench.queued_streams [--wait-s 120] [--idle-s 30] [--streams 10]`` (under
``switchyard embedded`` or with ``REDIS_URL`` set) starts a one-slot simulator and the real
router, then:

1. a holder stream takes the only slot for about ``wait_s`` seconds (2000 tokens at
   ``wait_s / 2000`` s each);
2. ``streams`` streams of a class with heartbeats (``--heartbeat-ms``, default 5000: the
   default) and ``streams`` of a class with heartbeats off queue behind it, all through an
   :class:`~bench.idle_proxy.IdleProxy` that closes a connection idle for ``idle_s``;
3. it reports, per class, the streams that completed (``data: [DONE]``, no error event), the
   broken ones, their queue wait (to the first data event) and the heartbeats each received.

The goal: 0 broken streams with heartbeats; the class without them is the control (every one
is cut once it is idle for ``idle_s``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import redis

from bench.idle_proxy import IdleProxy
from bench.procs import free_port, spawn
from bench.targets.base import REPO_ROOT, python_argv, python_env
from runtime.procs import Child
from runtime.snapshot_store import publish
from runtime.testing.snapshots import SnapshotBuilder, limits

MODEL = "queued-chat"
HOLD_TOKENS = 2000
KEY = "sy_benchq01_" + "b" * 40


@dataclass
class Outcome:
    done: int = 0
    broken: int = 0
    waits_s: list[float] = field(default_factory=list)
    beats: list[int] = field(default_factory=list)


async def one_stream(http: httpx.AsyncClient, klass: str, outcome: Outcome) -> None:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
            "stream": True}  # fmt: skip
    started, first, beats, text = time.monotonic(), None, 0, ""
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body,
                               headers={"X-Switchyard-Class": klass}) as answer:  # fmt: skip
            async for line in answer.aiter_lines():
                if line.startswith(": queued"):
                    beats += 1
                elif line.startswith("data: ") and first is None:
                    first = time.monotonic()
                text += line + "\n"
    except httpx.HTTPError:
        outcome.broken += 1
        return
    if text.rstrip().endswith("data: [DONE]") and '"finish_reason":"error"' not in text:
        outcome.done += 1
        outcome.waits_s.append((first or time.monotonic()) - started)
        outcome.beats.append(beats)
    else:
        outcome.broken += 1


def world(sim_url: str, heartbeat_ms: int, wait_s: float) -> SnapshotBuilder:
    deadline_ms = int((wait_s * 4 + 60) * 1000)
    builder = SnapshotBuilder()
    builder.add_class("beating", band=0, deadline_ms=deadline_ms, heartbeat_ms=heartbeat_ms)
    builder.add_class("quiet", band=0, deadline_ms=deadline_ms, heartbeat_ms=0)
    builder.add_tenant("acme", classes=("beating", "quiet"), default_class="beating",
                       tenant_limits=limits(max_output=HOLD_TOKENS))  # fmt: skip
    builder.add_key("bench", "acme", full_key=KEY)
    builder.add_model(MODEL, 1, max_context=8192)
    builder.add_pool("one-slot")
    builder.add_endpoint(1, 1, sim_url, pool="one-slot", capacity=1)
    return builder


async def run(args: argparse.Namespace) -> dict[str, Outcome]:
    redis_url = os.environ["REDIS_URL"]
    work = Path(tempfile.mkdtemp(prefix="bench-queued-"))
    prefix = f"bench:queued:{uuid.uuid4().hex[:8]}"
    children: list[Child] = []
    try:
        sim_port = free_port()
        decode_ms = args.wait_s * 1000.0 / HOLD_TOKENS
        sim = spawn("simulator", python_argv(
            "runtime.workers.simulator", "--model", MODEL, "--port", str(sim_port),
            "--max-num-seqs", "1", "--decode-a-ms", f"{decode_ms:.3f}", "--decode-b-ms", "0",
            "--max-model-len", "8192", "--log-level", "WARNING"),
            port=sim_port, log_dir=work, env=python_env(), cwd=REPO_ROOT)  # fmt: skip
        children.append(sim)
        await sim.async_wait_http("/health", timeout_s=30)
        client: redis.Redis[bytes] = redis.Redis.from_url(redis_url)
        snapshot = world(sim.base_url, args.heartbeat_ms, args.wait_s).snapshot()
        publish(client, snapshot, prefix=f"{prefix}:snapshot")
        port = free_port()
        env = python_env({
            "REDIS_URL": redis_url,
            "SWITCHYARD_SNAPSHOT_PREFIX": f"{prefix}:snapshot",
            "SWITCHYARD_VAR_DIR": str(work),
            "SWITCHYARD_LIMITS_PREFIX": f"{prefix}:limits",
            "SWITCHYARD_FAIRNESS_PREFIX": f"{prefix}:fairness",
            "SWITCHYARD_KEY_USAGE_HASH": f"{prefix}:apikey",
        })  # fmt: skip
        router = spawn("router", python_argv("runtime.gateway", "--host", "127.0.0.1", "--port",
                       str(port), "--workers", "1", "--log-level", "warning"),
                       port=port, log_dir=work, env=env, cwd=REPO_ROOT)  # fmt: skip
        children.append(router)
        await router.async_wait_http("/readyz", timeout_s=60)
        headers = {"Authorization": f"Bearer {KEY}"}
        timeout = httpx.Timeout(args.wait_s * 4 + 60)
        async with (
            httpx.AsyncClient(base_url=router.base_url, headers=headers, timeout=timeout) as direct,
            IdleProxy(port, idle_s=args.idle_s) as proxy,
            httpx.AsyncClient(base_url=proxy.base_url, headers=headers, timeout=timeout) as http,
        ):
            hold_body = {"model": MODEL, "messages": [{"role": "user", "content": "hold"}],
                         "max_tokens": HOLD_TOKENS, "stream": True}  # fmt: skip
            holder = asyncio.create_task(direct.post("/v1/chat/completions", json=hold_body))
            await asyncio.sleep(1.0)  # the holder reaches the engine first (a bench, not a test)
            outcomes = {"beating": Outcome(), "quiet": Outcome()}
            tasks = [
                asyncio.create_task(one_stream(http, klass, outcomes[klass]))
                for _ in range(args.streams)
                for klass in outcomes
            ]
            await asyncio.gather(*tasks)
            await holder
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
        client.close()
        return outcomes
    finally:
        for child in children:
            child.stop()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--wait-s", type=float, default=120.0, help="the holder's duration")
    parser.add_argument("--idle-s", type=float, default=30.0, help="the proxy's idle timeout")
    parser.add_argument("--heartbeat-ms", type=int, default=5000)
    parser.add_argument("--streams", type=int, default=10, help="streams per class")
    args = parser.parse_args(argv)
    outcomes = asyncio.run(run(args))
    print(f"queue wait ~{args.wait_s:.0f} s behind a proxy that cuts connections idle "
          f"{args.idle_s:.0f} s; heartbeats every {args.heartbeat_ms} ms")  # fmt: skip
    for klass, o in outcomes.items():
        waits = f"{min(o.waits_s):.1f}-{max(o.waits_s):.1f} s" if o.waits_s else "-"
        beats = f"{statistics.mean(o.beats):.1f}" if o.beats else "-"
        print(f"{klass:8s} completed {o.done:3d}  broken {o.broken:3d}  wait to first data "
              f"{waits}  heartbeats per stream {beats}")  # fmt: skip


if __name__ == "__main__":
    main()
