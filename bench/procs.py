"""Child processes of a run: start on a free 127.0.0.1 port, wait until up, stop, measure.

Every process the harness starts is a :class:`Child`; ``stop()`` sends SIGTERM, waits a
bounded time, then SIGKILLs; a child also gets SIGTERM by itself if the harness dies. CPU
time and memory come from ``/proc`` for the process and its descendants
(:class:`CpuSampler`), so a router that forks workers is measured whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

PR_SET_PDEATHSIG = 1
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class StartError(RuntimeError):
    """A child did not come up; the message holds the tail of its log."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def router_cpus() -> tuple[int, ...]:
    """The core routers are pinned to (the last one we may use), or () with a single core."""
    allowed = sorted(os.sched_getaffinity(0))
    return (allowed[-1],) if len(allowed) > 1 else ()


def pinned(argv: Sequence[str], cpus: Sequence[int]) -> list[str]:
    """``argv`` under ``taskset -c`` when cpus are given and taskset exists."""
    taskset = shutil.which("taskset")
    if not cpus or taskset is None:
        return list(argv)
    return [taskset, "-c", ",".join(str(c) for c in cpus), *argv]


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, chars: int = 3000) -> str:
        try:
            return self.log.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def _signal(self, sig: signal.Signals) -> None:
        # Its own session (start_new_session): the group is the child and what it forked.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, sig)

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the child's process group, then SIGKILL it after ``timeout_s``."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                self.proc.wait(timeout=timeout_s)
        self._signal(signal.SIGKILL)  # stragglers of the group, if any


def _die_with_parent() -> None:
    """In the child before exec: get SIGTERM if the harness dies (Linux ``PR_SET_PDEATHSIG``)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def spawn(
    name: str,
    argv: Sequence[str],
    *,
    port: int,
    log_dir: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> Child:
    """Start ``argv`` with stdout and stderr to ``log_dir/<name>.log``."""
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(  # noqa: S603 - argv is built by the harness, not a shell
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
            preexec_fn=_die_with_parent,  # noqa: PLW1509 - only prctl, no locks taken
        )
    return Child(name=name, proc=proc, port=port, log=log)


async def wait_http(
    child: Child,
    session: aiohttp.ClientSession,
    path: str,
    *,
    timeout_s: float,
    ok: Sequence[int] = (200,),
) -> None:
    """Poll ``GET path`` until it answers one of ``ok``; StartError on exit or timeout."""
    give_up = time.monotonic() + timeout_s
    url = f"{child.base_url}{path}"
    while time.monotonic() < give_up:
        if not child.alive():
            raise StartError(f"{child.name} exited ({child.proc.returncode}):\n{child.tail()}")
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
            async with session.get(url, timeout=aiohttp.ClientTimeout(total=2)) as resp:
                await resp.read()
                if resp.status in ok:
                    return
        await asyncio.sleep(0.1)
    raise StartError(f"{child.name}: {path} did not answer in {timeout_s:.0f}s:\n{child.tail()}")


def _descendants(pid: int) -> list[int]:
    """``pid`` and every process below it (via /proc/<pid>/task/*/children)."""
    found: list[int] = []
    stack = [pid]
    while stack and len(found) < 1000:
        current = stack.pop()
        found.append(current)
        for task in Path(f"/proc/{current}/task").glob("*/children"):
            with contextlib.suppress(OSError, ValueError):
                stack.extend(int(c) for c in task.read_text().split())
    return found


def _cpu_and_rss(pid: int) -> tuple[float, int]:
    """(user + system CPU seconds, resident bytes) of one process; zeros if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        fields = stat[stat.rindex(")") + 2 :].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        rss = int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE
    except (OSError, ValueError, IndexError):
        return 0.0, 0
    return cpu, rss


@dataclass
class Usage:
    cpu_s: float = 0.0
    wall_s: float = 0.0
    rss_peak_bytes: int = 0

    @property
    def cores(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "cpu_s": round(self.cpu_s, 4),
            "wall_s": round(self.wall_s, 4),
            "cores_used": round(self.cores, 4),
            "rss_peak_mib": round(self.rss_peak_bytes / 2**20, 2),
        }


@dataclass
class CpuSampler:
    """CPU seconds and peak RSS of some processes (and their children) over an interval."""

    pids: Sequence[int]
    interval_s: float = 0.5
    _start_cpu: dict[int, float] = field(default_factory=dict)
    _last_cpu: dict[int, float] = field(default_factory=dict)
    _started: float = 0.0
    _rss_peak: int = 0

    def _sample(self) -> None:
        rss_total = 0
        for root in self.pids:
            for pid in _descendants(root):
                cpu, rss = _cpu_and_rss(pid)
                if rss == 0:
                    continue
                self._start_cpu.setdefault(pid, cpu)
                self._last_cpu[pid] = cpu
                rss_total += rss
        self._rss_peak = max(self._rss_peak, rss_total)

    async def run(self, stop: asyncio.Event) -> Usage:
        """Sample every ``interval_s`` until ``stop`` is set; the usage in between."""
        self._started = time.monotonic()
        self._sample()
        while not stop.is_set():
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval_s)
            self._sample()
        cpu = sum(self._last_cpu[p] - self._start_cpu[p] for p in self._last_cpu)
        return Usage(
            cpu_s=cpu, wall_s=time.monotonic() - self._started, rss_peak_bytes=self._rss_peak
        )
