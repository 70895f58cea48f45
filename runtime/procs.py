"""Child processes and ports: the one toolkit the platform, the bench and the tests use.

- :func:`spawn` starts a child in its own process group (``start_new_session``), output to a
  log file (or a pipe), and makes it die with its parent (:func:`die_with_parent`:
  ``PR_SET_PDEATHSIG`` on Linux).
- :func:`wait_http` / :func:`async_wait_http` poll a URL until it answers, bounded in time, and
  give up at once when the child has exited.
- :func:`stop_group` / :func:`async_stop_group` stop a child's whole group: a signal to the group,
  then SIGKILL to whatever is left after a grace period, each step bounded.
- :func:`group_pids`, :func:`descendant_pids`, :func:`pid_alive` read ``/proc``, so a test or a
  supervisor can tell that no orphan survived.
- :func:`free_port`, :func:`port_is_free`, :func:`ensure_port_free`, :func:`port_accepts` check
  ports on 127.0.0.1.

:class:`Child` bundles a spawned process with its log and port. Plain Python: no Django, no
third-party import.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypedDict, Unpack

_PR_SET_PDEATHSIG = 1
STOP_GRACE_S = 10.0
KILL_WAIT_S = 5.0
POLL_S = 0.05


class StartError(RuntimeError):
    """A child did not come up; the message says why (and holds the tail of its log)."""


class PortInUseError(StartError):
    """A port a process needs on 127.0.0.1 is taken."""


# --- ports ---------------------------------------------------------------------------------


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int, host: str = "127.0.0.1") -> OSError | None:
    """None when ``host:port`` can be bound (as servers bind it), else the bind error."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # SO_REUSEADDR as servers set it: TIME_WAIT leftovers do not count, a listener does.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            return exc
    return None


def ensure_port_free(port: int, *, what: str, hint: str, host: str = "127.0.0.1") -> None:
    """Raise :class:`PortInUseError`, naming ``what`` and the ``hint``, when the port is taken."""
    error = port_is_free(port, host)
    if error is not None:
        raise PortInUseError(
            f"Port {port} on {host} is already in use, so {what} cannot start "
            f"({error.strerror or error}). Stop whatever listens there, or {hint}."
        ) from error


def port_accepts(port: int, host: str = "127.0.0.1", *, timeout: float = 0.5) -> bool:
    """Whether something accepts TCP connections on ``host:port`` (False: the port is closed)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


# --- /proc ---------------------------------------------------------------------------------


def _stat_fields(pid: int | str) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (state first)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return _stat_fields(pid)[0] != "Z"
    except (OSError, IndexError):
        return True


LIFELINE_ENV = "SWITCHYARD_EXIT_WITH_PID"


def watch_lifeline(
    environ: Mapping[str, str] | None = None, *, interval_s: float = 0.5
) -> threading.Thread | None:
    """Stop this process (SIGTERM to ourselves: its graceful path) once the process named by
    ``SWITCHYARD_EXIT_WITH_PID`` is gone; None when the variable is unset.

    ``switchyard up`` names itself there, so a model replica the autoscaler started (a child of
    whichever Celery process ran the tick) outlives that Celery process — its death or restart
    does not take the model down — but not ``up`` itself, even on ``kill -9``. PR_SET_PDEATHSIG
    cannot do this: it follows the direct parent only.
    """
    raw = (os.environ if environ is None else environ).get(LIFELINE_ENV, "").strip()
    if not raw.isdigit():
        return None
    pid = int(raw)

    def watch() -> None:
        while pid_alive(pid):
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=watch, name="lifeline", daemon=True)
    thread.start()
    return thread


def lifeline_strays(owner: int) -> list[int]:
    """Live processes started with ``SWITCHYARD_EXIT_WITH_PID=<owner>`` that are not
    descendants of ``owner``: the replicas an autoscaler tick of that ``up`` launched (their
    Celery parent gone), including one still importing, before its own lifeline watch runs."""
    mine = set(descendant_pids(owner))
    wanted = f"{LIFELINE_ENV}={owner}".encode()
    found = []
    for pid, state, _ppid, _pgid in _proc_table():
        if pid == owner or pid in mine or state == "Z":
            continue
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if wanted in environ.split(b"\0"):
            found.append(pid)
    return sorted(found)


def _proc_table() -> list[tuple[int, str, int, int]]:
    """(pid, state, ppid, pgid) of every process in /proc."""
    rows = []
    for entry in Path("/proc").glob("[0-9]*"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            fields = _stat_fields(entry.name)
            rows.append((int(entry.name), fields[0], int(fields[1]), int(fields[2])))
    return rows


def descendant_pids(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (empty where there is no /proc)."""
    children: dict[int, list[int]] = {}
    for child, state, ppid, _pgid in _proc_table():
        if state != "Z":
            children.setdefault(ppid, []).append(child)
    found: list[int] = []
    todo = [pid]
    while todo and len(found) < 10_000:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def group_pids(pgid: int) -> list[int]:
    """The live (non-zombie) processes of process group ``pgid``."""
    if not Path("/proc").is_dir():  # pragma: no cover - Linux has /proc
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [pgid]
    return [pid for pid, state, _ppid, group in _proc_table() if group == pgid and state != "Z"]


def cmdline(pid: int) -> str:
    """The command line of ``pid`` ("" when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace").strip()


def log_tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of a log file ("(no log)" when it cannot be read)."""
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.splitlines()[-lines:])


# --- spawning ------------------------------------------------------------------------------


def die_with_parent(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A ``preexec_fn`` so the child gets ``sig`` when its parent dies without stopping it.

    Linux ``PR_SET_PDEATHSIG`` (None elsewhere). If the parent died before the hook ran the child
    exits at once. The hook only calls prctl: safe between fork and exec.
    """
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


def spawn(
    argv: Sequence[str],
    *,
    log: Path | IO[bytes] | int | None = None,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
    new_group: bool = True,
    death_signal: int | None = signal.SIGTERM,
    **popen: Any,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` (stdin closed) in its own process group, stdout+stderr to ``log``.

    ``log`` is a path (appended to), an open binary file or a descriptor, ``subprocess.PIPE``,
    or None (inherit ours). ``death_signal`` (None: none) reaches the child when we die.
    """
    kwargs: dict[str, Any] = {
        "stdin": subprocess.DEVNULL,
        "env": dict(env) if env is not None else None,
        "cwd": cwd,
        "preexec_fn": die_with_parent(death_signal) if death_signal is not None else None,
        **popen,
    }
    if new_group:
        kwargs["process_group"] = 0
    with contextlib.ExitStack() as stack:
        out: IO[bytes] | int | None
        if isinstance(log, Path):
            log.parent.mkdir(parents=True, exist_ok=True)
            out = stack.enter_context(log.open("ab"))
        else:
            out = log
        if out is not None:
            kwargs.setdefault("stdout", out)
            kwargs.setdefault("stderr", subprocess.STDOUT)
        return subprocess.Popen(list(argv), **kwargs)  # noqa: S603 - argv built by callers


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to process group ``pgid``; nothing when it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def stop_group(
    proc: subprocess.Popen[bytes],
    *,
    sig: int = signal.SIGTERM,
    grace_s: float = STOP_GRACE_S,
    kill_wait_s: float = KILL_WAIT_S,
    leader_only: bool = False,
) -> int | None:
    """Stop ``proc`` and every process of its group: ``sig`` to the group (to ``proc`` alone with
    ``leader_only``: a server that stops its own children), SIGKILL to what is left after
    ``grace_s``. Returns the exit code (None if even SIGKILL did not end it within
    ``kill_wait_s``). ``proc`` must lead its own group (:func:`spawn` default)."""
    pgid = proc.pid
    if proc.poll() is None or group_pids(pgid):
        if leader_only:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
        else:
            signal_group(pgid, sig)
        deadline = time.monotonic() + grace_s
        while (proc.poll() is None or group_pids(pgid)) and time.monotonic() < deadline:
            time.sleep(POLL_S)
    signal_group(pgid, signal.SIGKILL)  # stragglers (a no-op when the group is empty)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(kill_wait_s)
    return proc.returncode


def stop_pid(
    pid: int, sig: int, *, timeout: float, wait: Callable[[float], object] | None = None
) -> bool:
    """Send ``sig`` to one process, SIGKILL if it outlives ``timeout``; True once it is gone.

    ``wait`` is ``Popen.wait`` for our own children (it reaps them); others are polled.
    """
    for signum, limit in ((sig, timeout), (signal.SIGKILL, KILL_WAIT_S)):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
        if wait is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                wait(limit)
                return True
        else:
            deadline = time.monotonic() + limit
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(POLL_S)
            if not pid_alive(pid):
                return True
    return False


async def async_stop_group(
    pgid: int,
    exited: Callable[[], bool],
    *,
    sig: int = signal.SIGTERM,
    grace_s: float = STOP_GRACE_S,
    kill_wait_s: float = KILL_WAIT_S,
) -> bool:
    """:func:`stop_group` on the event loop for a group led by ``pgid``; ``exited()`` says
    whether the leader has exited (and was reaped). True once the whole group is gone."""

    def gone() -> bool:
        return exited() and not group_pids(pgid)

    for signum, limit in ((sig, grace_s), (signal.SIGKILL, kill_wait_s)):
        if gone():
            return True
        signal_group(pgid, signum)
        deadline = time.monotonic() + limit
        while not gone() and time.monotonic() < deadline:  # noqa: ASYNC110 - polls /proc
            await asyncio.sleep(POLL_S)
    return gone()


# --- readiness -----------------------------------------------------------------------------


def _split(url: str) -> tuple[str, int, str, str]:
    """(host, port, path, host:port) of an http URL."""
    hostport, _, path = url.split("://", 1)[-1].partition("/")
    host, _, port = hostport.rpartition(":")
    return host.strip("[]"), int(port or 80), f"/{path}", hostport


def http_status(url: str, *, timeout: float = 2.0) -> int:
    """The status of ``GET url`` (http only); 0 when nothing answers."""
    host, port, path, _ = _split(url)
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        response.read()
        return int(response.status)
    except (OSError, http.client.HTTPException):
        return 0
    finally:
        conn.close()


class WaitOptions(TypedDict, total=False):
    """How :func:`wait_http` waits: ``exited()`` gives the child's exit code once it died,
    ``ok`` the statuses that count, ``detail()`` what a failure message ends with (e.g. the
    tail of the child's log), ``interval_s`` the pause between probes."""

    exited: Callable[[], int | None]
    ok: Sequence[int]
    detail: Callable[[], str]
    interval_s: float


def wait_http(url: str, *, timeout_s: float, **options: Unpack[WaitOptions]) -> int:
    """Poll ``GET url`` until it answers one of ``ok`` (default 200); return the status.

    Raises :class:`StartError` as soon as ``exited()`` gives an exit code, or after ``timeout_s``.
    """
    poll = _Poll(url, timeout_s, options)
    while (status := http_status(url, timeout=poll.probe_timeout())) not in poll.ok:
        poll.check()
        time.sleep(poll.interval_s)
    return status


class _Poll:
    """The bounds of one wait for a URL: give up once the child exited or time ran out."""

    def __init__(self, url: str, timeout_s: float, options: WaitOptions) -> None:
        self.url = url
        self.timeout_s = timeout_s
        self.exited = options.get("exited", lambda: None)
        self.detail = options.get("detail", lambda: "")
        self.ok = tuple(options.get("ok", (200,)))
        self.interval_s = options.get("interval_s", POLL_S)
        self.deadline = time.monotonic() + timeout_s
        self.check()

    def probe_timeout(self) -> float:
        return min(2.0, max(0.1, self.deadline - time.monotonic()))

    def check(self) -> None:
        code = self.exited()
        if code is not None or time.monotonic() >= self.deadline:
            why = (
                f"exited with code {code}"
                if code is not None
                else f"did not answer in {self.timeout_s:.0f} s"
            )
            raise StartError(f"{self.url}: the process {why}; its output:\n{self.detail()}")


async def async_http_status(url: str, *, timeout: float = 2.0) -> int:  # noqa: ASYNC109
    """:func:`http_status` on the event loop (a bare HTTP/1.0 GET); 0 when nothing answers."""
    host, port, path, hostport = _split(url)
    writer = None
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(f"GET {path} HTTP/1.0\r\nHost: {hostport}\r\n\r\n".encode())
            await writer.drain()
            line = await reader.readline()
        parts = line.split()
        return int(parts[1]) if len(parts) >= 2 and parts[1].isdigit() else 0
    except (OSError, TimeoutError, ValueError):
        return 0
    finally:
        if writer is not None:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


async def async_wait_http(url: str, *, timeout_s: float, **options: Unpack[WaitOptions]) -> int:
    """:func:`wait_http` on the event loop."""
    poll = _Poll(url, timeout_s, options)
    while (status := await async_http_status(url, timeout=poll.probe_timeout())) not in poll.ok:
        poll.check()
        await asyncio.sleep(poll.interval_s)
    return status


# --- a spawned child -----------------------------------------------------------------------


@dataclass
class Child:
    """A process started by :func:`start_child`: its own group, a log file, maybe a port."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    port: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def tail(self, chars: int = 3000) -> str:
        return self.output()[-chars:]

    def wait_http(self, path: str, *, timeout_s: float, ok: Sequence[int] = (200,)) -> None:
        """Block until ``GET path`` answers one of ``ok``; :class:`StartError` otherwise."""
        wait_http(
            f"{self.base_url}{path}", timeout_s=timeout_s, exited=self.proc.poll, ok=ok,
            detail=self.tail,
        )  # fmt: skip

    async def async_wait_http(
        self, path: str, *, timeout_s: float, ok: Sequence[int] = (200,)
    ) -> None:
        await async_wait_http(
            f"{self.base_url}{path}", timeout_s=timeout_s, exited=self.proc.poll, ok=ok,
            detail=self.tail,
        )  # fmt: skip

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGTERM the child's group, SIGKILL what is left after ``grace_s``."""
        return stop_group(self.proc, grace_s=grace_s)

    def kill(self) -> int | None:
        """SIGKILL the child's whole group at once."""
        return stop_group(self.proc, sig=signal.SIGKILL, grace_s=KILL_WAIT_S)


def start_child(
    name: str,
    argv: Sequence[str],
    *,
    log: Path,
    port: int = 0,
    env: Mapping[str, str] | None = None,
    cwd: Path | str | None = None,
) -> Child:
    """:func:`spawn` ``argv`` with its output written (truncated first) to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_bytes(b"")
    return Child(name=name, proc=spawn(argv, log=log, env=env, cwd=cwd), log=log, port=port)
