"""``--workers``: its default is the cores available to the process (affinity and cgroup CPU
quota, the smaller, at least 1; fake cgroup trees here), and the count reaches the workers'
config, so the Redis-down fallback divides each limit by routers x workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import uvicorn

from runtime.gateway import __main__ as gateway_main
from runtime.gateway.config import ENV_WORKERS, RouterConfig
from runtime.gateway.state import build_state
from runtime.gateway.workers import available_cores, cgroup_cpu_quota

pytestmark = pytest.mark.unit


def tree(tmp_path: Path, membership: str, files: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    root.mkdir(exist_ok=True)
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(membership)
    return root, proc


def cores(root: Path, proc: Path, affinity: int) -> int:
    return available_cores(root=root, proc_cgroup=proc, affinity=lambda: affinity)


@pytest.mark.parametrize(
    ("cpu_max", "affinity", "expected"),
    [
        ("200000 100000\n", 8, 2),  # quota: 2 CPUs of 8
        ("150000 100000\n", 8, 1),  # 1.5 CPUs: one worker (a second would be throttled)
        ("50000 100000\n", 8, 1),  # half a CPU: still one
        ("max 100000\n", 8, 8),  # no quota: the affinity mask
        ("400000 100000\n", 2, 2),  # affinity smaller than the quota
        ("garbage\n", 3, 3),
    ],
)
def test_cgroup_v2_quota_and_affinity(
    tmp_path: Path, cpu_max: str, affinity: int, expected: int
) -> None:
    root, proc = tree(tmp_path, "0::/\n", {"cpu.max": cpu_max})
    assert cores(root, proc, affinity) == expected


def test_cgroup_v2_the_smallest_quota_along_the_path(tmp_path: Path) -> None:
    root, proc = tree(
        tmp_path,
        "0::/kubepods/pod1/ctr\n",
        {"cpu.max": "max 100000", "kubepods/cpu.max": "300000 100000",
         "kubepods/pod1/cpu.max": "max 100000", "kubepods/pod1/ctr/cpu.max": "max 100000"},
    )  # fmt: skip
    assert cgroup_cpu_quota(root, proc) == 3.0
    assert cores(root, proc, 16) == 3


def test_cgroup_v1_cfs_quota(tmp_path: Path) -> None:
    membership = "12:memory:/docker/abc\n4:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n"
    root, proc = tree(tmp_path, membership, {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "250000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })  # fmt: skip
    assert cores(root, proc, 16) == 2


def test_cgroup_v1_no_quota_and_a_namespaced_path(tmp_path: Path) -> None:
    """Inside a container the path in /proc/self/cgroup may not exist in the mount: its root
    is the container's own cgroup then."""
    root, proc = tree(tmp_path, "4:cpu,cpuacct:/docker/abc\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "100000\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })  # fmt: skip
    assert cores(root, proc, 4) == 1
    root, proc = tree(tmp_path / "b", "4:cpu,cpuacct:/\n", {
        "cpu,cpuacct/cpu.cfs_quota_us": "-1\n",
        "cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    })  # fmt: skip
    assert cores(root, proc, 4) == 4


def test_no_cgroup_files_at_all(tmp_path: Path) -> None:
    assert cores(tmp_path / "none", tmp_path / "missing", 5) == 5
    assert cores(tmp_path / "none", tmp_path / "missing", 0) == 1  # at least one


class Captured:
    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {}
        self.target = ""

    def __call__(self, target: str, **kwargs: Any) -> None:
        self.target, self.kwargs = target, kwargs


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Captured:
    run = Captured()
    monkeypatch.setattr(uvicorn, "run", run)  # serving: test_gateway_workers.py
    monkeypatch.setenv("SWITCHYARD_VAR_DIR", str(tmp_path))
    for name in ("PROMETHEUS_MULTIPROC_DIR", ENV_WORKERS, "SWITCHYARD_ASSUMED_REPLICAS"):
        # main() writes some into os.environ: setenv first records them for the restore
        # (delenv alone records nothing for an absent variable, and they would leak)
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    return run


def test_workers_default_to_the_available_cores(captured: Captured) -> None:
    gateway_main.main(["--port", "0"])
    assert captured.kwargs["workers"] == available_cores()


def test_the_workers_count_reaches_the_fallback_divisor(
    captured: Captured, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("SWITCHYARD_ASSUMED_REPLICAS", "2")
    gateway_main.main(["--port", "0", "--workers", "3"])
    assert captured.kwargs["workers"] == 3
    assert captured.target == "runtime.gateway.workers:worker_app"  # dies with the master
    config = RouterConfig.from_env()  # what each worker reads
    assert (config.workers, config.assumed_replicas, config.limit_processes) == (3, 2, 6)
    state = build_state(config)
    assert state.limits.local.replicas == 6
    assert state.limits.local_credits.replicas == 6


def test_one_worker_is_the_plain_app(captured: Captured) -> None:
    gateway_main.main(["--port", "0", "--workers", "1"])
    assert captured.target == "runtime.gateway.app:create_app"
    assert RouterConfig.from_env().limit_processes == 2
    with pytest.raises(SystemExit):
        gateway_main.main(["--port", "0", "--workers", "0"])
