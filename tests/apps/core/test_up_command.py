"""`manage.py up` / `switchyard up`: clear errors before anything starts, and (e2e) the whole
platform on embedded servers: the admin answers with its CSS, the demo's secrets are printed on
the first run only, and Ctrl-C / SIGINT leaves no process behind."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command

from apps.core.management.commands.up import _without_password
from config.processes import descendant_pids, pid_alive

REPO = Path(__file__).resolve().parents[3]
READY_TIMEOUT_S = 150.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def var() -> Iterator[Path]:
    """A private var directory outside pytest's basetemp (PostgreSQL runs as another user)."""
    path = Path(tempfile.mkdtemp(prefix="switchyard-up-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.unit
def test_a_taken_control_plane_port_is_a_clear_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError) as caught:
            call_command("up", port=port)
    assert f"Port {port} on 127.0.0.1 is already in use" in str(caught.value)
    assert "the control plane" in str(caught.value)
    assert "--port" in str(caught.value)


@pytest.mark.integration
def test_a_taken_embedded_port_is_a_clear_error(monkeypatch: pytest.MonkeyPatch, var: Path) -> None:
    monkeypatch.delenv("DATABASE_URL", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("SWITCHYARD_VAR_DIR", str(var))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(CommandError) as caught:
            call_command("up", port=free_port(), pg_port=port)
    assert f"Port {port} on 127.0.0.1 is already in use" in str(caught.value)
    assert "SWITCHYARD_PG_PORT" in str(caught.value)


@pytest.mark.integration
def test_a_failing_step_stops_up_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, var: Path
) -> None:
    """Nothing listens on port 1: migrate cannot connect, and `up` says which step failed."""
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1:1/nothing")
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("SWITCHYARD_VAR_DIR", str(var))
    with pytest.raises(CommandError, match=r"migrate failed \(exit code 1\)"):
        call_command("up", port=free_port())


@pytest.mark.unit
def test_the_banner_hides_database_passwords() -> None:
    assert _without_password("postgres://u:secret@db:5432/x") == "postgres://u:***@db:5432/x"
    assert _without_password("redis://127.0.0.1:6379/0") == "redis://127.0.0.1:6379/0"


# --- end to end -------------------------------------------------------------------------------


def get(url: str) -> tuple[int, str, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            body = response.read().decode(errors="replace")
            return response.status, response.headers.get("Content-Type", ""), body
    except urllib.error.HTTPError as exc:
        return exc.code, "", ""


class Up:
    """`manage.py up` in its own process group (a terminal's foreground job); output to a file."""

    def __init__(self, var: Path, *, web: int, pg: int, redis: int) -> None:
        self.web = web
        self.log = var / f"up-{time.monotonic_ns()}.log"
        env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
        env["SWITCHYARD_VAR_DIR"] = str(var)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "manage.py", "up", "--port", str(web),
                 "--pg-port", str(pg), "--redis-port", str(redis)],
                cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=out,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        self.seen: set[int] = set()

    @property
    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, f"up exited early:\n{self.output[-4000:]}"
            self.seen.update(descendant_pids(self.proc.pid))
            try:
                if get(f"http://127.0.0.1:{self.web}/admin/login/")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        pytest.fail(f"admin did not answer within {READY_TIMEOUT_S} s:\n{self.output[-4000:]}")

    def stop(self, how: str) -> int:
        self.seen.update(descendant_pids(self.proc.pid))
        if how == "ctrl-c":  # what a terminal does: SIGINT to the whole foreground group
            os.killpg(self.proc.pid, signal.SIGINT)
        else:
            self.proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGTERM)
        try:
            return self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"up did not stop within 60 s:\n{self.output[-4000:]}")

    def kill(self) -> None:
        for pid in [*descendant_pids(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()

    def leftovers(self, timeout: float = 10.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while any(pid_alive(pid) for pid in self.seen) and time.monotonic() < deadline:
            time.sleep(0.2)
        return [
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            for pid in self.seen
            if pid_alive(pid)
        ]


@pytest.mark.e2e
def test_up_runs_the_platform_and_stops_every_process(var: Path) -> None:
    web, pg, rd = free_port(), free_port(), free_port()

    first = Up(var, web=web, pg=pg, redis=rd)
    try:
        first.wait_ready()
        status, _type, page = get(f"http://127.0.0.1:{web}/admin/login/")
        assert status == 200
        assert "Django administration" in page or "Switchyard" in page
        css = re.search(r'href="([^"]*/static/admin/css/base\.css)"', page)
        assert css is not None, page[:2000]
        status, content_type, body = get(f"http://127.0.0.1:{web}{css.group(1)}")
        assert (status, content_type.split(";")[0]) == (200, "text/css")
        assert "body" in body
        names = " ".join(
            Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            for pid in first.seen
            if pid_alive(pid)
        )
        for expected in ("postgres", "redis-server", "honcho", "uvicorn", "worker", "beat"):
            assert expected in names
        code = first.stop("sigint")
    finally:
        if first.proc.poll() is None:
            first.kill()
    assert code == 0, first.output[-4000:]
    assert first.leftovers() == []
    output = first.output
    assert re.search(r"operator login\s+operator / \S+", output)
    assert re.search(r"API key acme\s+sy_[a-z0-9]{8}_[A-Za-z0-9]{40}", output)
    assert re.search(r"API key globex\s+sy_[a-z0-9]{8}_[A-Za-z0-9]{40}", output)
    assert f"ready: http://127.0.0.1:{web}/admin/" in output

    # A second run reuses the data: nothing new is seeded, no secret is printed again.
    second = Up(var, web=web, pg=pg, redis=rd)
    try:
        second.wait_ready()
        code = second.stop("ctrl-c")
    finally:
        if second.proc.poll() is None:
            second.kill()
    assert code == 0, second.output[-4000:]
    assert second.leftovers() == []
    assert "demo data from an earlier run" in second.output
    assert not re.search(r"sy_[a-z0-9]{8}_", second.output)
    assert "operator login   operator /" not in second.output
    assert "initdb" not in (var / "postgres.log").read_text().split("starting PostgreSQL")[-1]
