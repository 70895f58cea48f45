"""Running a server process we own: lock, start, wait until ready, bounded stop, no orphans.

`ManagedServer` is the life cycle the embedded PostgreSQL and Redis share (config.embedded):
lock the data directory, stop a leftover server of a dead owner, check the port, start in its own
process group (Ctrl-C reaches the owner, which stops servers last), wait until it answers, and stop
it with its own shutdown signal, then SIGKILL, each step bounded in time. On Linux the server also
gets its shutdown signal if the owner dies without stopping it. The process and port primitives
are runtime.procs'.

Plain Python, no Django.
"""

from __future__ import annotations

import abc
import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from runtime.procs import (
    PortInUseError,
    StartError,
    descendant_pids,
    ensure_port_free,
    log_tail,
    pid_alive,
    spawn,
    stop_group,
    stop_pid,
)

__all__ = ["ManagedServer", "PortInUseError", "ServiceStartError", "as_user", "run_child"]

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0

# A server could not start; the message says why and where its log is.
ServiceStartError = StartError


def as_user(user: str | None) -> dict[str, Any]:
    """Popen arguments that run a child as ``user`` with that user's group and no other groups
    (our own group would otherwise still apply to group-permission checks); {} for None."""
    if user is None:
        return {}
    import pwd  # noqa: PLC0415 - POSIX only

    return {"user": user, "group": pwd.getpwnam(user).pw_gid, "extra_groups": []}


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
                # Its own group: Ctrl-C reaches the owner, which stops servers last.
                self._proc = spawn(
                    self._argv(),
                    log=log,
                    cwd=self.data_dir,
                    death_signal=self.stop_signal,
                    **as_user(self._run_as()),
                )
            self._wait_ready()
            self._after_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            # The server stops its own children; SIGKILL for the group after the bound.
            stop_group(proc, sig=self.stop_signal, grace_s=STOP_TIMEOUT_S, leader_only=True)
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing releases the flock
            self._lock_fd = None

    def exit_code(self) -> int | None:
        """None while the server runs; its exit code once it exited (0 when never started)."""
        return 0 if self._proc is None else self._proc.poll()

    def kill(self) -> None:
        """SIGKILL the server's whole group at once (a crash, for tests and supervisors); a
        later :meth:`start` starts it again on the same data directory."""
        proc = self._proc
        if proc is not None:
            stop_group(proc, sig=signal.SIGKILL, grace_s=STOP_TIMEOUT_S)
        self.stop()

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
            time.sleep(0.1)
