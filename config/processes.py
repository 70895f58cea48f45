"""Running a server process we own: port checks, readiness, bounded stops, no orphans.

`ManagedServer` is the life cycle the embedded PostgreSQL and Redis share (config.embedded):
lock the data directory, stop a leftover server of a dead owner, check the port, start in its own
process group (Ctrl-C reaches the owner, which stops servers last), wait until it answers, and stop
it with its own shutdown signal, then SIGKILL, each step bounded in time. On Linux the server also
gets its shutdown signal if the owner dies without stopping it.

Plain Python, no Django.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1


class ServiceStartError(RuntimeError):
    """A server could not start; the message says why and where its log is."""


class PortInUseError(ServiceStartError):
    """The port a server needs on 127.0.0.1 is taken."""


def ensure_port_free(port: int, *, what: str, hint: str) -> None:
    """Raise PortInUseError, naming ``what`` and the ``hint``, when 127.0.0.1:port is taken."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR as servers set it: TIME_WAIT leftovers do not count, a listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise PortInUseError(
                f"Port {port} on 127.0.0.1 is already in use, so {what} cannot start "
                f"({exc.strerror}). Stop whatever listens there, or {hint}."
            ) from exc


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


def descendant_pids(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (read from /proc; empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry.name))
    found: list[int] = []
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


def die_with_parent(sig: signal.Signals) -> Callable[[], None] | None:
    """A preexec hook so the server gets ``sig`` if its owner dies without stopping it (Linux)."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # noqa: PLC0415 - Linux only

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    owner = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
        if os.getppid() != owner:  # the owner died before the hook ran
            os._exit(1)

    return hook


def cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def as_user(user: str | None) -> dict[str, Any]:
    """Popen arguments that run a child as ``user`` with that user's group and no other groups
    (our own group would otherwise still apply to group-permission checks); {} for None."""
    if user is None:
        return {}
    import pwd  # noqa: PLC0415 - POSIX only

    return {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


def stop_pid(
    pid: int, sig: int, *, timeout: float, wait: Callable[[float], object] | None = None
) -> bool:
    """Send ``sig`` to ``pid``, then SIGKILL if it outlives ``timeout``; True once it is gone.

    ``wait`` is ``Popen.wait`` for our own children (it reaps them); others are polled.
    """
    for signum, limit in ((sig, timeout), (signal.SIGKILL, 5.0)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        if wait is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                wait(limit)
                return True
        else:
            deadline = time.monotonic() + limit
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not pid_alive(pid):
                return True
    return False


def _terminal_sent_it() -> bool:
    """True when we are the foreground job of a terminal: its Ctrl-C reached our child too."""
    try:
        return os.tcgetpgrp(sys.stdin.fileno()) == os.getpgrp()
    except (OSError, ValueError, AttributeError):
        return False


def run_child(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path | None = None,
    kill_after: float | None = None,
) -> int:
    """Run ``argv`` in our process group until it exits; return its exit code (128+N on signal N).

    SIGTERM and SIGHUP are passed on to the child; so is SIGINT, unless a terminal sent it (the
    terminal delivers Ctrl-C to the whole foreground group, child included, and a second SIGINT
    would cut its cleanup short). With ``kill_after``, a child and all its descendants still
    alive that many seconds after the first signal are killed.
    """
    proc = subprocess.Popen(list(argv), env=dict(env), cwd=cwd)  # noqa: S603
    first_signal: list[float] = []

    def forward(signum: int, _frame: object) -> None:
        first_signal.append(time.monotonic())
        if signum == signal.SIGINT and _terminal_sent_it():
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signum)

    forwarded = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {sig: signal.signal(sig, forward) for sig in forwarded}
    try:
        while True:
            try:
                code = proc.wait(timeout=0.5 if kill_after is not None else None)
                break
            except subprocess.TimeoutExpired:
                if first_signal and time.monotonic() - first_signal[0] > (kill_after or 0.0):
                    for pid in [*descendant_pids(proc.pid), proc.pid]:
                        with contextlib.suppress(ProcessLookupError):
                            os.kill(pid, signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            if handler is not None:
                signal.signal(sig, handler)
    return code if code >= 0 else 128 - code


class ManagedServer(abc.ABC):
    """Common life cycle: lock the data directory, start, wait until ready, stop."""

    name = "server"
    port_env = ""
    stop_signal = signal.SIGTERM

    def __init__(
        self, data_dir: Path | str, port: int, *, start_timeout: float = START_TIMEOUT_S
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.start_timeout = start_timeout
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.log"
        self._lock_path = self.data_dir.parent / f"{self.data_dir.name}.lock"
        self._lock_fd: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    @abc.abstractmethod
    def url(self) -> str:
        """The client URL of the running server."""

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    # Hooks for the concrete servers.
    def _prepare(self) -> None:  # noqa: B027 - optional hook
        """Create or check the data directory."""

    @abc.abstractmethod
    def _argv(self) -> list[str]:
        """The server's command line."""

    def _run_as(self) -> str | None:
        return None

    @abc.abstractmethod
    def _ready(self) -> bool:
        """Whether the server accepts clients yet."""

    def _after_ready(self) -> None:  # noqa: B027 - optional hook
        """Anything to do once the server answers."""

    def _stale_pid(self) -> int | None:
        """The pid of a server left running on this data directory by an owner that died."""
        return None

    def start(self) -> Self:
        if self._proc is not None:
            return self
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            self._stop_stale()
            ensure_port_free(
                self.port,
                what=f"the embedded {self.name}",
                hint=f"choose another port with {self.port_env}",
            )
            self._prepare()
            with self.log_path.open("ab") as log:
                log.write(
                    f"--- switchyard: starting {self.name} on 127.0.0.1:{self.port}\n".encode()
                )
                log.flush()
                self._proc = subprocess.Popen(  # noqa: S603 - fixed argv of a bundled binary
                    self._argv(),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    cwd=self.data_dir,
                    process_group=0,  # Ctrl-C reaches the owner, which stops servers last
                    **as_user(self._run_as()),
                    preexec_fn=die_with_parent(self.stop_signal),  # noqa: PLW1509
                )
            self._wait_ready()
            self._after_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            stop_pid(proc.pid, self.stop_signal, timeout=STOP_TIMEOUT_S, wait=proc.wait)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def _lock(self) -> None:
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ServiceStartError(
                f"{self.data_dir} is in use by another Switchyard process (lock "
                f"{self._lock_path}). Stop that process, or set SWITCHYARD_VAR_DIR elsewhere."
            ) from None
        self._lock_fd = fd

    def _stop_stale(self) -> None:
        pid = self._stale_pid()
        if pid is not None and pid_alive(pid):
            with self.log_path.open("ab") as log:
                log.write(f"--- switchyard: stopping a leftover {self.name} (pid {pid})\n".encode())
            stop_pid(pid, self.stop_signal, timeout=STOP_TIMEOUT_S)

    def _wait_ready(self) -> None:
        assert self._proc is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            code = self._proc.poll()
            if code is not None:
                raise ServiceStartError(
                    f"The embedded {self.name} exited with code {code} while starting on port "
                    f"{self.port}; its log is {self.log_path}. "
                    f"Last lines:\n{log_tail(self.log_path)}"
                )
            if self._ready():
                return
            if time.monotonic() > deadline:
                raise ServiceStartError(
                    f"The embedded {self.name} did not accept connections on 127.0.0.1:{self.port} "
                    f"within {self.start_timeout:.0f} s; its log is {self.log_path}. "
                    f"Last lines:\n{log_tail(self.log_path)}"
                )
            time.sleep(0.2)
