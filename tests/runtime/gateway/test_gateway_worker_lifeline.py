"""``--workers 2``: when the master dies by ``kill -9`` its workers stop too (SIGTERM, their
graceful path) and free the port, instead of living on as orphans that hold the listening
socket (a restarted router could not bind it)."""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest
from fixtures.router import Publisher, start_router
from fixtures.wait import eventually

from runtime.procs import cmdline, descendant_pids, pid_alive, port_is_free

pytestmark = [pytest.mark.integration, pytest.mark.timeout(150)]


def workers_of(master: int) -> list[int]:
    """uvicorn's workers of ``master`` (multiprocessing's spawned children)."""
    return [pid for pid in descendant_pids(master) if "spawn_main" in cmdline(pid)]


def test_workers_die_with_a_killed_master(tmp_path: Path) -> None:
    publisher = Publisher(f"switchyard:test:lifeline:{uuid.uuid4().hex[:10]}")
    router = start_router(publisher.prefix, tmp_path, workers=2)
    try:
        workers = eventually(lambda: len(w := workers_of(router.pid)) >= 2 and w, timeout=60,
                             what="two workers")  # fmt: skip
        os.kill(router.pid, signal.SIGKILL)
        router.proc.wait(timeout=10)
        eventually(lambda: not any(pid_alive(p) for p in workers), timeout=45,
                   what=f"the workers {workers} to exit after the master's kill -9")  # fmt: skip
        eventually(lambda: port_is_free(router.port) is None, timeout=10, what="the port free")
    finally:
        router.stop()
        publisher.cleanup()
