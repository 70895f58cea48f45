"""config.supervise: the supervisor ``up`` runs its processes under. Small stand-in children
(real processes, real kill -9), the embedded Redis for the server case; every wait bounded."""

from __future__ import annotations

import io
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from fixtures.redis_server import private_redis
from fixtures.wait import eventually

from config.supervise import Command, RestartPolicy, Server, Supervisor, procfile_entries
from runtime.procs import group_pids, pid_alive

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

# A child that says it is up, then starts a grandchild in its group and waits.
STEADY = f"{sys.executable} -c \"import subprocess, time; print('up', flush=True); subprocess.Popen(['sleep', '60']); time.sleep(60)\""  # noqa: E501
FAST = RestartPolicy(backoff_s=0.1, backoff_max_s=0.2, max_restarts=2, window_s=30.0)


class Run:
    """A supervisor on a background thread, its notes and its children's output recorded."""

    def __init__(self, commands: dict[str, str], *, policy: RestartPolicy = FAST) -> None:
        self.out = io.StringIO()
        self.notes: list[str] = []
        self.commands = {
            name: Command(name=name, command=line, env=dict(os.environ), cwd=Path.cwd(),
                          out=self.out)
            for name, line in commands.items()
        }  # fmt: skip
        self.supervisor = Supervisor(
            list(self.commands.values()), note=self.notes.append, policy=policy, stop_grace_s=5
        )
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.supervisor.run, args=(self.stop,), daemon=True)

    def pid(self, name: str) -> int | None:
        proc = self.commands[name].proc
        return None if proc is None or proc.poll() is not None else proc.pid

    def group(self, name: str) -> list[int]:
        pid = self.pid(name)
        return [] if pid is None else group_pids(pid)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join(20)
        assert not self.thread.is_alive()


@pytest.fixture
def run() -> Iterator[Run]:
    created: list[Run] = []

    def make(commands: dict[str, str], **kwargs: RestartPolicy) -> Run:
        created.append(Run(commands, **kwargs))
        created[-1].thread.start()
        return created[-1]

    yield make  # type: ignore[misc]
    for each in created:
        each.finish()


def test_procfile_entries_skip_comments() -> None:
    text = '# web: no\nweb: uvicorn app --port "$PORT"\n\nworker: celery -A x worker\n'
    assert procfile_entries(text) == {
        "web": 'uvicorn app --port "$PORT"',
        "worker": "celery -A x worker",
    }


def test_a_killed_process_is_restarted_and_the_others_keep_running(run) -> None:  # type: ignore[no-untyped-def]
    sup = run({"one": STEADY, "two": STEADY})
    eventually(lambda: len(sup.group("one")) == 2 and len(sup.group("two")) == 2, timeout=20)
    old_group, two = sup.group("one"), sup.pid("two")
    killed_at = time.monotonic()
    os.kill(sup.pid("one"), signal.SIGKILL)  # kill -9 of the process, not its grandchild
    eventually(lambda: sup.pid("one") not in (None, old_group[0]), timeout=10, what="restart")
    restarted_s = time.monotonic() - killed_at
    eventually(lambda: len(sup.group("one")) == 2, timeout=10)
    assert sup.pid("two") == two  # untouched
    assert any("one exited with code -9; restarting it in 0 s" in n for n in sup.notes), sup.notes
    assert "one restarted" in sup.notes
    assert restarted_s < 2.0, f"restarted after {restarted_s:.2f} s"
    assert sup.out.getvalue().count("one    | up") >= 2  # its output, prefixed, both lives
    everything = [*sup.group("one"), *sup.group("two")]
    sup.finish()
    eventually(lambda: not [p for p in [*everything, *old_group] if pid_alive(p)], timeout=10)


def test_a_crash_loop_is_left_stopped_and_the_rest_keeps_running(run) -> None:  # type: ignore[no-untyped-def]
    sup = run({"bad": "sh -c 'echo failing; exit 3'", "good": STEADY})
    eventually(lambda: any("left stopped" in n for n in sup.notes), timeout=15, what="give up")
    given_up = next(n for n in sup.notes if "left stopped" in n)
    assert given_up.startswith("bad exited with code 3; it exited 3 times within 30 s")
    assert sup.notes.count("bad restarted") == 2
    assert sup.pid("good") is not None
    good = sup.group("good")
    sup.finish()
    eventually(lambda: not [p for p in good if pid_alive(p)], timeout=10, what="good stopped")


def test_stopping_ends_every_process_group_within_the_grace(run) -> None:  # type: ignore[no-untyped-def]
    stubborn = f"{sys.executable} -c \"import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)\""  # noqa: E501
    sup = run({"steady": STEADY, "stubborn": stubborn})
    eventually(lambda: "stubborn|up" in sup.out.getvalue().replace(" ", ""), timeout=20)
    eventually(lambda: len(sup.group("steady")) == 2, timeout=20)
    pids = [*sup.group("steady"), *sup.group("stubborn")]
    started = time.monotonic()
    sup.finish()
    took = time.monotonic() - started
    assert not [p for p in pids if pid_alive(p)]
    assert took < 10, f"stopping took {took:.1f} s"  # 5 s grace, then SIGKILL


def test_the_embedded_redis_is_restarted_with_its_data(tmp_path: Path) -> None:
    notes: list[str] = []
    with private_redis(tmp_path) as server:
        client = redis.Redis.from_url(server.url, socket_timeout=2)
        client.set("kept", "yes")
        supervisor = Supervisor([Server(server)], note=notes.append, policy=FAST)
        stop = threading.Event()
        thread = threading.Thread(target=supervisor.run, args=(stop,), kwargs={"started": True})
        thread.start()
        try:
            old = server.pid
            assert old is not None
            killed_at = time.monotonic()
            os.kill(old, signal.SIGKILL)

            def serving() -> bool:
                try:
                    return bool(client.ping())
                except redis.RedisError:
                    return False

            eventually(lambda: server.pid not in (None, old) and serving(), timeout=20)
            back_s = time.monotonic() - killed_at
            assert client.get("kept") == b"yes"  # the append-only file survived the kill
            assert any(n.startswith("redis exited with code -9") for n in notes), notes
            print(f"\nembedded Redis serving again {back_s:.2f} s after kill -9")
            assert back_s < 5.0
        finally:
            stop.set()
            thread.join(20)
            client.close()
