"""Fixtures for the upstream tests: real simulator processes and tiny misbehaving servers.

Simulators run as subprocesses of ``python -m runtime.workers.simulator`` on free
127.0.0.1 ports; every process started here is stopped by its fixture's finalizer.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator

import pytest
import pytest_asyncio
from fixtures.net import free_port
from fixtures.router import Process, spawn, wait_until_up

from runtime.gateway.config import DEFAULT_UPSTREAM_CLIENT
from runtime.snapshot import EndpointSnap
from runtime.testing.snapshots import endpoint_snap
from runtime.upstream import UpstreamClient, UpstreamResponse
from runtime.upstream.choice import new_client
from runtime.upstream.client import ClientConfig

SIM_MODEL = "sim-model"


def make_client(config: ClientConfig | None = None) -> UpstreamClient:
    """The router's upstream client: ``SWITCHYARD_UPSTREAM_CLIENT``'s kind (the router's
    default when unset), so these tests run against either (test_upstream_conformance.py
    runs its cases against both)."""
    kind = os.environ.get("SWITCHYARD_UPSTREAM_CLIENT") or DEFAULT_UPSTREAM_CLIENT
    return new_client(kind.strip().lower(), config)


@pytest_asyncio.fixture
async def client() -> AsyncIterator[UpstreamClient]:
    """An upstream client with the default configuration (a test file may define its own)."""
    c = make_client()
    yield c
    await c.close()


def endpoint(endpoint_id: int, base_url: str, *, capacity: int = 8) -> EndpointSnap:
    return endpoint_snap(endpoint_id, 1, base_url, pool="pool", capacity=capacity)


async def drain(resp: UpstreamResponse, sink: list[bytes]) -> None:
    """Read every event of ``resp`` into ``sink`` (so a test sees what came before a failure)."""
    async for event in resp.events():
        sink.append(event)  # noqa: PERF401 - keep what arrived before a failure


Simulator = Process  # a simulator subprocess (base_url, stop, kill)


def start_simulator(*args: str) -> Simulator:
    """Start a simulator and wait (bounded) until its /health answers 200."""
    argv = ["runtime.workers.simulator", "--model", SIM_MODEL, "--log-level", "WARNING", *args]
    process, _port = spawn(argv)
    return wait_until_up(process, "/health")


@pytest.fixture(scope="module")
def simulator() -> Iterator[Simulator]:
    """A default simulator (decode ≈ 10 ms/token), shared by a module's tests."""
    sim = start_simulator()
    yield sim
    sim.stop()


@pytest.fixture(scope="module")
def failing_simulator() -> Iterator[Simulator]:
    """A simulator that cuts every generation's connection after 5 tokens."""
    sim = start_simulator("--fail-after-tokens", "5")
    yield sim
    sim.stop()


@pytest.fixture
def single_seq_simulator() -> Iterator[Simulator]:
    """A simulator running one sequence at a time (the rest wait); tests may kill it."""
    sim = start_simulator("--max-num-seqs", "1")
    yield sim
    sim.stop()


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on: connecting is refused at once."""
    return free_port()
