"""Fixtures for the upstream tests: real simulator processes and tiny misbehaving servers.

Simulators run as subprocesses of ``python -m runtime.workers.simulator`` on free
127.0.0.1 ports; every process started here is stopped by its fixture's finalizer.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fixtures.net import free_port

from runtime.snapshot import EndpointSnap
from runtime.upstream import UpstreamResponse

REPO_ROOT = Path(__file__).resolve().parents[3]
SIM_MODEL = "sim-model"
START_TIMEOUT_S = 30.0


def endpoint(endpoint_id: int, base_url: str, *, capacity: int = 8) -> EndpointSnap:
    return EndpointSnap(
        id=endpoint_id,
        pool="pool",
        version=1,
        base_url=base_url,
        state="ready",
        capacity=capacity,
    )


async def drain(resp: UpstreamResponse, sink: list[bytes]) -> None:
    """Read every event of ``resp`` into ``sink`` (so a test sees what came before a failure)."""
    async for event in resp.events():
        sink.append(event)  # noqa: PERF401 - keep what arrived before a failure


@dataclass
class Simulator:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.log.unlink(missing_ok=True)

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


def start_simulator(*args: str) -> Simulator:
    """Start a simulator and wait (bounded) until its /health answers 200."""
    port = free_port()
    fd, name = tempfile.mkstemp(prefix="switchyard-sim-", suffix=".log")
    os.close(fd)
    log = Path(name)
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "runtime.workers.simulator",
                "--host", "127.0.0.1", "--port", str(port), "--model", SIM_MODEL,
                "--log-level", "WARNING", *args,
            ],
            cwd=REPO_ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
    sim = Simulator(proc=proc, port=port, log=log)
    give_up = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < give_up:
        if proc.poll() is not None:
            break
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"{sim.base_url}/health", timeout=1) as resp,
        ):
            if resp.status == 200:
                return sim
        time.sleep(0.1)
    sim.kill()
    output = log.read_text(errors="replace")[-4000:]
    sim.stop()
    raise RuntimeError(f"simulator did not start; its output:\n{output}")


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
