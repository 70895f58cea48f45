"""The router's worker processes: how many by default, and their tie to the master.

``--workers`` defaults to :func:`available_cores`: the CPUs this process may run on
(``os.sched_getaffinity``) or its cgroup's CPU quota, whichever is smaller, at least 1 — not
``os.cpu_count()``, which counts the node's cores, not the container's share of them. The quota
is the smallest along the process's cgroup path (a parent's quota caps its children):

- cgroup v2: ``cpu.max`` (``"<quota> <period>"`` or ``"max <period>"``);
- cgroup v1: ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` in the ``cpu`` controller's mount
  (quota ``-1``: none).

A quota of 1.5 CPUs counts as 1 (a second worker would only be throttled).

:func:`worker_app` is the app factory the workers of ``--workers N`` > 1 run: a worker gets
SIGTERM (its graceful path) when the master dies, even by ``kill -9`` — without it the workers
would live on as orphans holding the listening socket, so a restarted router could not bind it.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runtime.gateway.app import RouterApp

CGROUP_ROOT = Path("/sys/fs/cgroup")
PROC_CGROUP = Path("/proc/self/cgroup")
_PR_SET_PDEATHSIG = 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _along(mount: Path, relative: str) -> list[Path]:
    """``mount``/``relative`` and each of its ancestors up to ``mount`` (those that exist)."""
    parts = [p for p in relative.strip("/").split("/") if p and p != ".."]
    dirs = [mount.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()] or [mount]


def _v2_quota(directory: Path) -> float | None:
    text = _read(directory / "cpu.max")
    if text is None:
        return None
    fields = text.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = int(fields[0]), int(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def _v1_quota(directory: Path) -> float | None:
    quota_text, period_text = _read(directory / "cpu.cfs_quota_us"), _read(
        directory / "cpu.cfs_period_us"
    )
    if quota_text is None or period_text is None:
        return None
    try:
        quota, period = int(quota_text), int(period_text)
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def cgroup_cpu_quota(root: Path = CGROUP_ROOT, proc_cgroup: Path = PROC_CGROUP) -> float | None:
    """The CPUs the process's cgroup may use (quota / period, the smallest along its path), or
    None when no quota applies or none can be read."""
    membership = _read(proc_cgroup) or ""
    quotas: list[float] = []
    for line in membership.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, relative = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2 (the unified hierarchy)
            found = [_v2_quota(d) for d in _along(root, relative)]
        elif "cpu" in controllers.split(","):  # cgroup v1, the cpu controller's mount
            mounts = [root / controllers, root / "cpu", root / "cpu,cpuacct"]
            mount = next((m for m in mounts if m.is_dir()), None)
            if mount is None:
                continue
            found = [_v1_quota(d) for d in _along(mount, relative)]
        else:
            continue
        quotas += [q for q in found if q is not None]
    if not membership:  # no /proc/self/cgroup: the root's own files, v2 then v1
        quotas += [q for q in (_v2_quota(root), _v1_quota(root / "cpu")) if q is not None]
    return min(quotas) if quotas else None


def _affinity() -> int:
    getter: Callable[[int], set[int]] | None = getattr(os, "sched_getaffinity", None)
    if getter is not None:
        return len(getter(0))
    return os.cpu_count() or 1


def available_cores(
    *,
    root: Path = CGROUP_ROOT,
    proc_cgroup: Path = PROC_CGROUP,
    affinity: Callable[[], int] = _affinity,
) -> int:
    """CPUs this process may use: its affinity mask or its cgroup quota (rounded down), the
    smaller, at least 1."""
    cores = affinity()
    quota = cgroup_cpu_quota(root, proc_cgroup)
    if quota is not None:
        cores = min(cores, math.floor(quota))
    return max(1, cores)


def _die_with_master() -> None:
    """SIGTERM to this worker when its parent (uvicorn's master) dies; exit if it is gone."""
    parent = multiprocessing.parent_process()
    if parent is None or not sys.platform.startswith("linux"):
        return
    import ctypes  # noqa: PLC0415 - Linux only

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent.pid:  # the master died before the call
        os.kill(os.getpid(), signal.SIGTERM)


def worker_app() -> RouterApp:
    """The app a worker of ``--workers N`` serves (uvicorn factory)."""
    from runtime.gateway.app import create_app  # noqa: PLC0415 - in the worker only

    _die_with_master()
    return create_app()
