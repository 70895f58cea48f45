"""runtime.procs: the process and port toolkit, with real processes (each bounded in time)."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fixtures.wait import eventually

from runtime.procs import (
    PortInUseError,
    StartError,
    ensure_port_free,
    free_port,
    group_pids,
    pid_alive,
    port_accepts,
    port_is_free,
    spawn,
    start_child,
    stop_group,
    wait_http,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

IGNORES_SIGTERM = (
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
    "print('ignoring', flush=True); time.sleep(60)"
)


def test_stop_group_ends_the_child_and_everything_it_started() -> None:
    proc = spawn(["/bin/sh", "-c", "sleep 60 & sleep 60 & wait"])
    members = eventually(lambda: group_pids(proc.pid) if len(group_pids(proc.pid)) == 3 else None)
    assert stop_group(proc, grace_s=5) is not None
    assert not [pid for pid in members if pid_alive(pid)]


def test_stop_group_sigkills_what_ignores_sigterm_after_the_grace() -> None:
    proc = spawn([sys.executable, "-c", IGNORES_SIGTERM], log=subprocess.PIPE)
    assert proc.stdout is not None
    assert proc.stdout.readline() == b"ignoring\n"  # its handler is in place
    started = time.monotonic()
    assert stop_group(proc, grace_s=0.5) == -signal.SIGKILL
    assert time.monotonic() - started < 5


def test_a_child_dies_with_its_parent(tmp_path: Path) -> None:
    script = (
        "import sys, time\n"
        "from runtime.procs import spawn\n"
        "child = spawn(['sleep', '60'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(60)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
        cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert pid_alive(child)
    finally:
        parent.kill()  # no chance to clean up
        parent.wait()
    eventually(lambda: not pid_alive(child), timeout=10, what="the orphan to get its SIGTERM")


def test_port_checks() -> None:
    port = free_port()
    assert port_is_free(port) is None
    assert not port_accepts(port)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", port))
        listener.listen()
        assert port_is_free(port) is not None
        assert port_accepts(port)
        taken = f"Port {port} on 127.0.0.1 is already in use, so the thing"
        with pytest.raises(PortInUseError, match=taken):
            ensure_port_free(port, what="the thing", hint="pass --port N")


def test_wait_http_says_why_it_gave_up(tmp_path: Path) -> None:
    dead = start_child("dead", [sys.executable, "-c", "print('bye'); raise SystemExit(4)"],
                       log=tmp_path / "dead.log", port=free_port())  # fmt: skip
    with pytest.raises(StartError, match="exited with code 4; its output:\nbye"):
        dead.wait_http("/health", timeout_s=10)
    url = f"http://127.0.0.1:{free_port()}/health"
    started = time.monotonic()
    with pytest.raises(StartError, match="did not answer in 1 s"):
        wait_http(url, timeout_s=1.0)
    assert time.monotonic() - started < 3


LIFELINE_CHILD = (
    "import sys, time; from runtime.procs import watch_lifeline; "
    "watcher = watch_lifeline(interval_s=0.05); print('watching' if watcher else 'unset', "
    "flush=True); time.sleep(60)"
)


def test_a_process_stops_once_its_lifeline_is_gone_not_with_its_parent(tmp_path: Path) -> None:
    """``up`` names itself in SWITCHYARD_EXIT_WITH_PID: a replica outlives the (Celery) process
    that started it, and stops (SIGTERM to itself) once ``up`` is gone."""
    lifeline = spawn(["sleep", "60"])
    log = tmp_path / "child.log"
    env = {"SWITCHYARD_EXIT_WITH_PID": str(lifeline.pid), "PYTHONPATH": str(Path.cwd())}
    child = spawn([sys.executable, "-c", LIFELINE_CHILD], log=log, env=env, death_signal=None)
    try:
        eventually(lambda: "watching" in log.read_text())
        time.sleep(0.3)  # scenario: several watch intervals pass while the lifeline lives
        assert child.poll() is None
        stop_group(lifeline, grace_s=1.0)
        assert eventually(child.poll, timeout=10.0) == -signal.SIGTERM
    finally:
        stop_group(child, grace_s=1.0)
        stop_group(lifeline, grace_s=1.0)


def test_no_lifeline_no_watcher() -> None:
    from runtime.procs import watch_lifeline  # noqa: PLC0415

    assert watch_lifeline({}) is None
    assert watch_lifeline({"SWITCHYARD_EXIT_WITH_PID": "not-a-pid"}) is None


def test_lifeline_strays_are_the_processes_named_for_an_owner_outside_its_tree() -> None:
    """What ``up`` sweeps at the end of its shutdown: processes started with its pid as their
    lifeline that are not its own descendants (a replica an autoscaler tick was launching)."""
    from runtime.procs import lifeline_strays  # noqa: PLC0415

    # The owner starts one child of its own with the variable set: not a stray.
    owner = spawn(["sh", "-c", "SWITCHYARD_EXIT_WITH_PID=$$ exec sleep 60 & wait"])
    env = {"SWITCHYARD_EXIT_WITH_PID": str(owner.pid), "PATH": "/usr/bin:/bin"}
    stray = spawn(["sleep", "60"], env=env)  # started elsewhere, naming the owner
    other = spawn(["sleep", "60"], env={**env, "SWITCHYARD_EXIT_WITH_PID": "1"})
    try:
        eventually(
            lambda: [p for p in group_pids(owner.pid) if p != owner.pid], what="its own child"
        )
        assert lifeline_strays(owner.pid) == [stray.pid]
        stop_group(stray, grace_s=1.0)
        assert eventually(lambda: lifeline_strays(owner.pid) == [], timeout=5.0)
    finally:
        for proc in (stray, other, owner):
            stop_group(proc, grace_s=1.0)
