"""`switchyard embedded -- CMD`: the test command's wrapper. Runs CMD with DATABASE_URL/REDIS_URL
of embedded servers (only for the unset ones), returns CMD's exit code, and stops the servers
afterwards — also on Ctrl-C and SIGTERM."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures.net import free_port, port_accepts
from fixtures.wait import eventually

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent
SWITCHYARD = [str(Path(sys.executable).parent / "switchyard")]  # the console script
SHOW_ENV = (
    "import json, os, sys; "
    "print(json.dumps({k: os.environ.get(k) for k in "
    "('DATABASE_URL', 'REDIS_URL', 'SWITCHYARD_VAR_DIR')}), flush=True); "
)


@pytest.fixture
def var() -> Iterator[Path]:
    """A private directory outside pytest's basetemp (see test_embedded_servers.tmp_path)."""
    path = Path(tempfile.mkdtemp(prefix="switchyard-cli-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def switchyard(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*SWITCHYARD, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env.update(extra)
    return env


def test_the_command_sees_the_urls_and_its_exit_code_is_returned(var: Path) -> None:
    pg, rd = free_port(), free_port()
    done = switchyard(
        "embedded", "--var-dir", str(var), "--pg-port", str(pg), "--redis-port", str(rd),
        "--", sys.executable, "-c", SHOW_ENV + "sys.exit(3)", env=clean_env(),
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen == {
        "DATABASE_URL": f"postgres://postgres@127.0.0.1:{pg}/switchyard",
        "REDIS_URL": f"redis://127.0.0.1:{rd}/0",
        "SWITCHYARD_VAR_DIR": str(var.resolve()),
    }
    assert "embedded PostgreSQL" in done.stderr
    assert not port_accepts(pg)
    assert not port_accepts(rd)


def test_ports_and_var_dir_come_from_the_environment(var: Path) -> None:
    pg, rd = free_port(), free_port()
    env = clean_env(
        SWITCHYARD_VAR_DIR=str(var), SWITCHYARD_PG_PORT=str(pg), SWITCHYARD_REDIS_PORT=str(rd)
    )
    done = switchyard("embedded", "--", sys.executable, "-c", SHOW_ENV, env=env)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["DATABASE_URL"] == f"postgres://postgres@127.0.0.1:{pg}/switchyard"
    assert seen["REDIS_URL"] == f"redis://127.0.0.1:{rd}/0"
    assert (var / "postgres" / "PG_VERSION").is_file()


def test_set_urls_start_nothing(var: Path) -> None:
    env = clean_env(DATABASE_URL="postgres://x@127.0.0.1:1/db", REDIS_URL="redis://127.0.0.1:1/0")
    done = switchyard(
        "embedded", "--var-dir", str(var / "v"), "--", sys.executable, "-c", SHOW_ENV, env=env
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["DATABASE_URL"] == "postgres://x@127.0.0.1:1/db"
    assert seen["REDIS_URL"] == "redis://127.0.0.1:1/0"
    assert not (var / "v").exists()


@pytest.mark.parametrize("how", ["ctrl-c", "sigterm"])
def test_interrupting_stops_the_command_and_the_servers(var: Path, how: str) -> None:
    pg, rd = free_port(), free_port()
    wrapper = subprocess.Popen(
        [*SWITCHYARD, "embedded", "--var-dir", str(var), "--pg-port", str(pg),
         "--redis-port", str(rd), "--", sys.executable, "-c",
         "import time; print('running', flush=True); time.sleep(120)"],
        cwd=REPO, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,  # its own process group, as a terminal's foreground job has
    )  # fmt: skip
    try:
        assert wrapper.stdout is not None
        assert wrapper.stdout.readline().strip() == "running"
        assert port_accepts(pg)
        assert port_accepts(rd)
        if how == "ctrl-c":  # a terminal's Ctrl-C: SIGINT to the whole foreground group
            os.killpg(wrapper.pid, signal.SIGINT)
        else:  # e.g. a supervisor: SIGTERM to the wrapper alone
            wrapper.send_signal(signal.SIGTERM)
        code = wrapper.wait(timeout=60)
    finally:
        if wrapper.poll() is None:
            os.killpg(wrapper.pid, signal.SIGKILL)
            wrapper.wait()
    expected = 128 + (signal.SIGINT if how == "ctrl-c" else signal.SIGTERM)
    assert code == expected
    eventually(
        lambda: not port_accepts(pg) and not port_accepts(rd), timeout=10, what="ports closed"
    )


def test_a_taken_port_is_a_clear_error(var: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = switchyard(
            "embedded", "--var-dir", str(var), "--redis-port", str(port), "--",
            sys.executable, "-c", "print('must not run')",
            env=clean_env(DATABASE_URL="postgres://x@127.0.0.1:1/db"),
        )  # fmt: skip
    assert done.returncode == 1
    assert "must not run" not in done.stdout
    assert f"Port {port} on 127.0.0.1 is already in use" in done.stderr
    assert "SWITCHYARD_REDIS_PORT" in done.stderr


def test_a_missing_command_is_a_usage_error() -> None:
    done = switchyard("embedded")
    assert done.returncode == 2
    assert "embedded needs a command" in done.stderr


def test_an_unknown_program_exits_127(var: Path) -> None:
    env = clean_env(DATABASE_URL="postgres://x@127.0.0.1:1/db", REDIS_URL="redis://127.0.0.1:1/0")
    done = switchyard("embedded", "--", "no-such-program-switchyard", env=env)
    assert done.returncode == 127
    assert "command not found: no-such-program-switchyard" in done.stderr
