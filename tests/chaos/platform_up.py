"""One real ``switchyard up`` (``manage.py up``) for the chaos suite, and its processes.

``up`` runs with DATABASE_URL and REDIS_URL unset, so it starts its embedded PostgreSQL and
Redis (the Redis kill needs the embedded one); every port it has is a free one, the encoder's
(``SWITCHYARD_ENCODER_PORT``, no option) included, and its var directory is private.

The processes are found by what they are, not by who launched them: every process ``up``'s
tree starts inherits ``SWITCHYARD_VAR_DIR=<this var dir>``, so :meth:`PlatformUp.pids` is the
descendants of ``up`` plus every process whose environment names this var directory (a
worker started by someone else, a Celery task's child, an engine core re-parented to init),
plus their descendants. :meth:`PlatformUp.find` picks one of them by command line.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures.net import free_port

from runtime.procs import cmdline, descendant_pids, pid_alive

REPO = Path(__file__).resolve().parents[2]
MODEL_READY_TIMEOUT_S = 480.0  # vLLM on CPU: ~1 min alone on 2 cores, more when they are busy
KEY_RE = r"sy_[a-z0-9]{8}_[A-Za-z0-9]{40}"


def http_status(url: str, timeout: float = 3.0) -> int:
    """The status of ``GET url`` (0 when nothing answered)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError:
        return 0


def _environ_has(pid: int, marker: bytes) -> bool:
    try:
        return marker in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False


class PlatformUp:
    """``manage.py up`` in its own session, output to a file under the var directory."""

    def __init__(self, var: Path) -> None:
        self.var = var
        self.ports = {name: free_port() for name in
                      ("port", "router-port", "pg-port", "redis-port")}  # fmt: skip
        self.encoder_port = free_port()
        self.log = var / "up.log"
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env["SWITCHYARD_VAR_DIR"] = str(var)
        env["SWITCHYARD_ENCODER_PORT"] = str(self.encoder_port)
        self._marker = f"SWITCHYARD_VAR_DIR={var}".encode()
        flags = [part for name, port in self.ports.items() for part in (f"--{name}", str(port))]
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "up", *flags],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.seen: set[int] = set()
        self.engine_ports: set[int] = set()  # every engine port seen (the stray-process check)

    @property
    def router(self) -> str:
        return f"http://127.0.0.1:{self.ports['router-port']}"

    @property
    def web(self) -> str:
        return f"http://127.0.0.1:{self.ports['port']}"

    @property
    def redis_port(self) -> int:
        return self.ports["redis-port"]

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def pids(self) -> list[int]:
        """Every live process of this platform (see the module docstring); remembered."""
        found = set(descendant_pids(self.proc.pid))
        for entry in Path("/proc").glob("[0-9]*"):
            pid = int(entry.name)
            if pid not in found and pid != os.getpid() and _environ_has(pid, self._marker):
                found.add(pid)
                found.update(descendant_pids(pid))
        found.discard(os.getpid())
        live = [pid for pid in found if pid_alive(pid)]
        self.seen.update(live)
        return live

    def find(self, pattern: str) -> list[int]:
        """The live processes of this platform whose command line matches ``pattern``."""
        regex = re.compile(pattern)
        return sorted(pid for pid in self.pids() if regex.search(cmdline(pid)))

    def wait_for(self, what: str, ready: Callable[[], bool], timeout_s: float) -> float:
        """Seconds until ``ready()`` (polled every 0.1 s); fails the test after ``timeout_s``."""
        started = time.monotonic()
        while time.monotonic() - started < timeout_s:
            assert self.proc.poll() is None, f"up exited:\n{self.output[-4000:]}"
            with contextlib.suppress(OSError):
                if ready():
                    return time.monotonic() - started
            time.sleep(0.1)
        pytest.fail(f"{what} not within {timeout_s:.0f} s:\n{self.output[-4000:]}")

    def wait_model_ready(self) -> float:
        return self.wait_for(
            "'model ready' printed",
            lambda: "model ready: demo-llama" in self.output,
            MODEL_READY_TIMEOUT_S,
        )

    def api_key(self) -> str:
        found = re.search(rf"API key acme\s+({KEY_RE})", self.output)
        assert found is not None, self.output[-4000:]
        return found.group(1)

    def stop(self) -> int:
        """Ctrl-C, as a terminal sends it (SIGINT to the foreground group); bounded."""
        self.pids()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGINT)
        try:
            return self.proc.wait(timeout=90)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"up did not stop within 90 s:\n{self.output[-4000:]}")

    def kill(self) -> None:
        """SIGKILL to everything of this platform (a failed test's cleanup)."""
        for pid in [*self.pids(), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()

    def leftovers(self, timeout_s: float = 15.0) -> list[str]:
        """Command lines of this platform's processes still alive after ``timeout_s``: every
        process ever seen, and any process whose environment names the var directory."""
        deadline = time.monotonic() + timeout_s
        alive: list[int] = []
        while time.monotonic() < deadline:
            alive = [pid for pid in self.seen if pid_alive(pid)]
            alive += [p for p in self.pids() if p not in alive]
            if not alive:
                return []
            time.sleep(0.2)
        return [f"{pid}: {cmdline(pid)}" for pid in alive]
