"""The backends every target shares: vLLM-compatible simulators (default) or vLLM on CPU.

Backends run on the cores the routers are not pinned to, so a router's figures are its own.
Between two measured phases the runner waits until every backend is idle
(:func:`wait_idle`), so each target starts from empty queues.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import aiohttp

from bench.procs import Child, free_port, pinned, spawn, wait_http
from bench.scenario import BackendSpec
from bench.targets.base import REPO_ROOT, python_argv, python_env

RUNNING = "vllm:num_requests_running"
WAITING = "vllm:num_requests_waiting"


def kv_events_args(spec: BackendSpec, events_port: int | None) -> list[str]:
    """The flags that make a backend publish its KV events on ``events_port`` (none: off)."""
    if events_port is None:
        return []
    if spec.kind == "simulator":
        return ["--kv-events-endpoint", f"tcp://127.0.0.1:{events_port}"]
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{events_port}"}  # fmt: skip  # vLLM binds only wildcards
    return ["--kv-events-config", json.dumps(config)]


def backend_argv(
    spec: BackendSpec, port: int, index: int, events_port: int | None = None
) -> list[str]:
    common = ["--host", "127.0.0.1", "--port", str(port), *kv_events_args(spec, events_port)]
    if spec.kind == "vllm":
        return python_argv(
            "vllm.entrypoints.openai.api_server",
            *common,
            "--model",
            spec.model_path,
            "--served-model-name",
            spec.model,
            "--max-model-len",
            str(spec.max_model_len),
            "--max-num-seqs",
            str(spec.max_num_seqs),
            *spec.extra_args,
        )
    return python_argv(
        "runtime.workers.simulator",
        *common,
        "--model",
        spec.model,
        "--prefill-tps",
        str(spec.prefill_tps),
        "--decode-a-ms",
        str(spec.decode_a_ms),
        "--decode-b-ms",
        str(spec.decode_b_ms),
        "--max-num-seqs",
        str(spec.max_num_seqs),
        "--kv-capacity-tokens",
        str(spec.kv_capacity_tokens),
        "--max-model-len",
        str(spec.max_model_len),
        "--seed",
        str(index),
        "--log-level",
        "WARNING",
        "--block-size",
        str(spec.block_size),
        "--prefix-cache-blocks",
        str(spec.cache_blocks()),
        *spec.extra_args,
    )


async def start_backends(
    spec: BackendSpec,
    *,
    session: aiohttp.ClientSession,
    log_dir: Path,
    cpus: tuple[int, ...],
    timeout_s: float,
    events_ports: Sequence[int] = (),
    nice: int = 0,
) -> list[Child]:
    """Start ``spec.count`` backends and wait for their /health; all or none. With
    ``events_ports`` (one per backend), backend ``i`` publishes KV events on port ``i``;
    ``nice`` > 0 runs them at that niceness, below the load generator that shares their
    cores (its schedule comes first: a client that falls behind voids the phase)."""
    children: list[Child] = []
    try:
        for i in range(spec.count):
            port = free_port()
            events = events_ports[i] if events_ports else None
            argv = pinned(backend_argv(spec, port, i, events), cpus)
            if nice > 0:
                argv = ["nice", "-n", str(nice), *argv]
            children.append(
                spawn(f"backend-{i}", argv, port=port, log_dir=log_dir, env=python_env(),
                      cwd=REPO_ROOT)
            )  # fmt: skip
        wait = timeout_s if spec.kind == "simulator" else max(timeout_s, 600.0)
        await asyncio.gather(*(wait_http(c, session, "/health", timeout_s=wait) for c in children))
    except BaseException:
        for child in children:
            await asyncio.to_thread(child.stop)
        raise
    return children


def gauge(text: str, name: str) -> float:
    """The sum of every series of ``name`` in a Prometheus text exposition."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (len(line) == len(name) or line[len(name)] in "{ "):
            with contextlib.suppress(ValueError):
                total += float(line.rpartition(" ")[2])
    return total


async def wait_idle(
    children: list[Child], session: aiohttp.ClientSession, *, timeout_s: float
) -> bool:
    """Wait until no backend runs or queues a request; False if that took over ``timeout_s``."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        busy = 0.0
        for child in children:
            try:
                async with session.get(
                    f"{child.base_url}/metrics", timeout=aiohttp.ClientTimeout(total=2)
                ) as resp:
                    text = await resp.text()
            except (aiohttp.ClientError, TimeoutError):
                busy += 1
                continue
            busy += gauge(text, RUNNING) + gauge(text, WAITING)
        if busy == 0:
            return True
        await asyncio.sleep(0.1)
    return False
