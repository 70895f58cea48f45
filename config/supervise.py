"""A small process supervisor for ``up``: one process's exit never stops the platform.

:class:`Supervisor` runs the Procfile's processes (:class:`Command`, each a shell line in its own
process group, its output prefixed with its name) and watches the embedded servers ``up`` started
(:class:`Server`, a ``config.processes.ManagedServer``). Whenever one exits it is started again
after a backoff (1 s, doubling up to 30 s); one that exits more than ``max_restarts`` times within
``window_s`` is left stopped, saying why, while the others keep running. :meth:`Supervisor.run`
returns when ``stop`` is set and re-raises KeyboardInterrupt (Ctrl-C, or SIGTERM turned into one
by ``up``); either way every command's process group gets SIGTERM, then SIGKILL after a grace
period. The servers are stopped by their owner (``config.embedded.switchyard_env``), last.

Plain Python, no Django.
"""

from __future__ import annotations

import abc
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from config.processes import ManagedServer
from runtime.procs import signal_group, spawn, stop_group

POLL_S = 0.2
STOP_GRACE_S = 15.0
_PROCFILE_LINE = re.compile(r"^([A-Za-z0-9_-]+):\s*(.+)$")


def procfile_entries(text: str) -> dict[str, str]:
    """``name -> command`` of a Procfile (comments and blank lines skipped)."""
    entries: dict[str, str] = {}
    for line in text.splitlines():
        found = _PROCFILE_LINE.match(line.strip())
        if found and not line.lstrip().startswith("#"):
            entries[found.group(1)] = found.group(2).strip()
    return entries


@dataclass(frozen=True, kw_only=True)
class RestartPolicy:
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    max_restarts: int = 10
    window_s: float = 300.0


class Unit(abc.ABC):
    """Something the supervisor keeps running."""

    name: str

    @abc.abstractmethod
    def start(self) -> None: ...

    @abc.abstractmethod
    def exit_code(self) -> int | None:
        """None while it runs; its exit code (negative: killed by that signal) once it exited."""

    def signal_stop(self) -> None:  # noqa: B027 - servers are stopped by their owner
        """Begin stopping (a signal), without waiting."""

    def stop(self, grace_s: float) -> None:  # noqa: B027
        """Stop it, bounded; SIGKILL whatever is left after ``grace_s``."""


@dataclass(eq=False)
class Command(Unit):
    """A Procfile line run by ``/bin/sh`` (which execs it) in its own process group."""

    name: str
    command: str
    env: Mapping[str, str]
    cwd: Path
    out: IO[str]
    lock: threading.Lock = field(default_factory=threading.Lock)
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.proc is not None:  # a restart: what is left of the old group goes (no orphans)
            signal_group(self.proc.pid, signal.SIGKILL)
        self.proc = spawn(
            ["/bin/sh", "-c", f"exec {self.command}"],
            log=subprocess.PIPE,
            env=self.env,
            cwd=self.cwd,
        )
        threading.Thread(
            target=self._pump, args=(self.proc,), name=f"up-{self.name}", daemon=True
        ).start()

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode(errors="replace").rstrip("\r\n")
            with self.lock:
                self.out.write(f"{time.strftime('%H:%M:%S')} {self.name:<7}| {line}\n")
                self.out.flush()

    def exit_code(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def signal_stop(self) -> None:
        if self.proc is not None:
            signal_group(self.proc.pid, signal.SIGTERM)

    def stop(self, grace_s: float) -> None:
        if self.proc is not None:
            stop_group(self.proc, grace_s=grace_s)


@dataclass(eq=False)
class Server(Unit):
    """An embedded server its owner started; restarted on the same data when it exits."""

    server: ManagedServer

    def __post_init__(self) -> None:
        self.name = self.server.name.lower()

    def start(self) -> None:
        self.server.stop()  # reaps it and releases its lock
        self.server.start()

    def exit_code(self) -> int | None:
        return self.server.exit_code()


@dataclass
class _Track:
    exits: list[float] = field(default_factory=list)
    restart_at: float | None = None
    given_up: bool = False


class Supervisor:
    """Keeps ``units`` running until stopped; see the module docstring."""

    def __init__(
        self,
        units: Sequence[Unit],
        *,
        note: Callable[[str], None],
        policy: RestartPolicy | None = None,
        stop_grace_s: float = STOP_GRACE_S,
    ) -> None:
        self.units = list(units)
        self.policy = policy or RestartPolicy()
        self.stop_grace_s = stop_grace_s
        self._note = note
        self._tracks = {id(unit): _Track() for unit in self.units}
        self.restarts: list[tuple[str, float]] = []  # (name, seconds from exit seen to restart)

    def run(self, stop: threading.Event, *, started: bool = False) -> None:
        """Start the commands (servers are running already), supervise until ``stop``."""
        try:
            if not started:
                for unit in self.units:
                    if isinstance(unit, Command):
                        unit.start()
            while not stop.wait(POLL_S):
                self.check()
        finally:
            self.stop_all()

    def check(self) -> None:
        """One round: notice exits, restart what is due."""
        now = time.monotonic()
        for unit in self.units:
            track = self._tracks[id(unit)]
            if track.given_up:
                continue
            if track.restart_at is None:
                code = unit.exit_code()
                if code is not None:
                    unit.signal_stop()  # the rest of its group: SIGTERM now, SIGKILL at restart
                    self._exited(unit, track, code, now)
            elif now >= track.restart_at:
                waited = now - track.exits[-1]
                try:
                    unit.start()
                except Exception as exc:
                    self._exited(unit, track, None, now, error=exc)
                    continue
                track.restart_at = None
                self.restarts.append((unit.name, waited))
                self._note(f"{unit.name} restarted")

    def _exited(
        self,
        unit: Unit,
        track: _Track,
        code: int | None,
        now: float,
        *,
        error: BaseException | None = None,
    ) -> None:
        policy = self.policy
        track.exits = [t for t in track.exits if t > now - policy.window_s] + [now]
        what = f"failed to start ({error})" if error is not None else f"exited with code {code}"
        if len(track.exits) > policy.max_restarts:
            track.given_up = True
            self._note(
                f"{unit.name} {what}; it exited {len(track.exits)} times within "
                f"{policy.window_s:.0f} s, so it is left stopped (see its output above); "
                "the other processes keep running"
            )
            return
        delay = min(policy.backoff_s * 2 ** (len(track.exits) - 1), policy.backoff_max_s)
        track.restart_at = now + delay
        self._note(f"{unit.name} {what}; restarting it in {delay:.0f} s")

    def stop_all(self) -> None:
        """SIGTERM every command's group at once, then wait (bounded) for each."""
        commands = [unit for unit in self.units if isinstance(unit, Command)]
        for unit in commands:
            unit.signal_stop()
        deadline = time.monotonic() + self.stop_grace_s
        for unit in commands:
            unit.stop(max(0.1, deadline - time.monotonic()))
