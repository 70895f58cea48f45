"""Child processes of a run: start on a free 127.0.0.1 port, wait until up, stop, measure.

Every process the harness starts is a :class:`runtime.procs.Child` (its own process group, a
log file, SIGTERM by itself if the harness dies); ``stop()`` sends SIGTERM to the group, waits
a bounded time, then SIGKILLs. CPU time and memory come from ``/proc`` for the process and its
descendants (:class:`CpuSampler`), so a router that forks workers is measured whole.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from runtime.procs import Child, StartError, descendant_pids, free_port, start_child

__all__ = [
    "Child",
    "CpuSampler",
    "StartError",
    "Usage",
    "extra_router_cpus",
    "free_port",
    "pinned",
    "router_cpus",
    "spawn",
    "wait_http",
]

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


def router_cpus() -> tuple[int, ...]:
    """The core routers are pinned to (the last one we may use), or () with a single core."""
    allowed = sorted(os.sched_getaffinity(0))
    return (allowed[-1],) if len(allowed) > 1 else ()


def extra_router_cpus(routers: Sequence[int], count: int) -> tuple[int, ...]:
    """The cores for ``count`` more router workers: those just below the routers' core, in
    the order a run hands them out (the same whatever this process is pinned to)."""
    if not routers or count <= 0:
        return ()
    below = [c for c in range(min(routers) - 1, -1, -1) if c not in routers]
    return tuple(below[:count])


def pinned(argv: Sequence[str], cpus: Sequence[int]) -> list[str]:
    """``argv`` under ``taskset -c`` when cpus are given and taskset exists."""
    taskset = shutil.which("taskset")
    if not cpus or taskset is None:
        return list(argv)
    return [taskset, "-c", ",".join(str(c) for c in cpus), *argv]


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
    return start_child(name, argv, log=log_dir / f"{name}.log", port=port, env=env, cwd=cwd)


async def wait_http(
    child: Child,
    _session: aiohttp.ClientSession,
    path: str,
    *,
    timeout_s: float,
    ok: Sequence[int] = (200,),
) -> None:
    """Poll ``GET path`` until it answers one of ``ok``; StartError on exit or timeout."""
    await child.async_wait_http(path, timeout_s=timeout_s, ok=ok)


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
            for pid in [root, *descendant_pids(root)]:
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
