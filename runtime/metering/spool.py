"""An append-only local file of pending settlements (DESIGN §5: nothing is lost), one per
router process.

Every settlement is written here (one ``write(2)``, no fsync: a killed process loses nothing
the kernel already has) before the background task sends it to Redis. A flush takes the
current file's :meth:`Spool.mark` (what it holds when the batch is taken); once Redis has
applied the batch, :meth:`Spool.applied` starts the current file over — truncated in place, one
``ftruncate(2)``, when nothing was written since the mark; else :meth:`Spool.rotate`\\ d into a
numbered segment (its later lines are not applied yet), which is :meth:`Spool.discard`\\ ed
once a later batch applied them (issue #27: not a rename, an open and an unlink per flush). A
line leaves the spool only after Redis applied it. Segments and files left behind (Redis was
down, the router was killed) are read back by :meth:`Spool.pending` and applied again — the
settle script ignores a lease it already settled, so a replay is harmless.

Layout: the spool root (``SWITCHYARD_VAR_DIR/usage-spool``) holds numbered *slots*
(``usage-spool/0``, ``usage-spool/1``, ...), each a directory with a ``lock`` file, the
``current.jsonl`` being written and its ``segment-NNNNNNNNN.jsonl`` files. A process claims a
slot by an exclusive ``fcntl.flock`` on its lock file, held until :meth:`Spool.close` or the
process's death (the kernel drops it then, even on ``kill -9``); the lock file names the
holder's pid, for a look by hand.

Rules:

- **One writer per slot.** :meth:`Spool.open` takes the first slot whose lock is free (creating
  ``n`` if all of ``0..n-1`` are held), so the N workers of ``--workers N`` — and routers that
  share a var dir — each write their own files: no process renames, overwrites or discards
  another's segment.
- **A dead process's spool is not orphaned.** The slot it held becomes free when it dies; the
  next process to claim that slot reads back what is there (:meth:`Spool.pending`), and a live
  process *adopts* every free slot that holds data (:meth:`Spool.adopt`, at open and then
  periodically): under the slot's lock it moves the files into its own slot as new segments,
  so they are replayed by exactly one process. Files of the older single-directory layout at
  the root are adopted the same way (a ``rename`` each, which only one process can win).
- **Nothing is replayed twice by two processes** (a slot's files move only under its lock, and a
  rename is atomic); a settlement replayed twice by one process (a crash between Redis applying
  it and the segment's discard) is applied once by the settle script's done-key.
- Locks are ``flock``: the spool root must be on a local file system (not NFS), as the var dir
  already is.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

CURRENT = "current.jsonl"
LOCK = "lock"
_SEGMENT_GLOB = "segment-*.jsonl"


def _try_lock(directory: Path) -> int | None:
    """An fd holding the exclusive lock of slot ``directory`` (created if missing), or None
    when another open file holds it."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _release(fd: int) -> None:
    with contextlib.suppress(OSError):
        fcntl.flock(fd, fcntl.LOCK_UN)
    os.close(fd)


def _slot_number(path: Path) -> int | None:
    return int(path.name) if path.name.isdigit() and path.is_dir() else None


class Spool:
    """See the module docstring. ``root`` is the spool root; :meth:`open` claims a slot."""

    __slots__ = ("_dir", "_fd", "_lock", "_root", "_seq", "_written")

    def __init__(self, root: Path) -> None:
        self._root = root
        self._dir: Path | None = None
        self._fd: int | None = None
        self._lock: int | None = None
        self._seq = 0
        self._written = 0  # bytes this process wrote to the current file since it was empty

    @property
    def directory(self) -> Path | None:
        """The claimed slot's directory (None before :meth:`open` and after :meth:`close`)."""
        return self._dir

    def open(self) -> None:
        """Claim the first free slot, then adopt what free slots and the root hold."""
        if self._lock is not None:
            raise RuntimeError("spool already open")
        self._root.mkdir(parents=True, exist_ok=True)
        number = 0
        while True:  # bounded: every held slot belongs to a live process
            lock = _try_lock(self._root / str(number))
            if lock is not None:
                break
            number += 1
        self._lock, self._dir = lock, self._root / str(number)
        os.ftruncate(lock, 0)
        os.pwrite(lock, f"{os.getpid()}\n".encode(), 0)
        self._seq = max((self._number(p) for p in self.segments()), default=0)
        self._fd = os.open(self._dir / CURRENT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._written = 0
        self.rotate()  # an earlier run's lines: a segment (see pending), never truncated away
        self.adopt()

    def close(self) -> None:
        """Close the current file and give the slot up (what it holds stays for the next)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
        lock, self._lock = self._lock, None
        if lock is not None:
            _release(lock)
        self._dir = None

    def append(self, line: bytes) -> None:
        """One record (no newline inside), written straight to the kernel."""
        if self._fd is not None:
            self._written += os.write(self._fd, line + b"\n")

    def mark(self) -> int:
        """Where the current file is now: pass it to :meth:`applied` once every line written
        so far is applied."""
        return self._written

    def applied(self, mark: int) -> Path | None:
        """Every line of the current file up to ``mark`` is applied (and the caller's earlier
        segments too): truncate it when nothing was written since (None), else rotate it and
        return the segment, to :meth:`discard` once its later lines are applied."""
        if self._fd is None or self._written != mark:
            return self.rotate()
        if mark:
            os.ftruncate(self._fd, 0)  # O_APPEND: the next line goes at 0
            self._written = 0
        return None

    def rotate(self) -> Path | None:
        """Close the current file as the next segment and start a new one; None if empty."""
        if self._fd is None or self._dir is None or os.fstat(self._fd).st_size == 0:
            return None
        current = self._dir / CURRENT
        segment = self._next_segment()
        os.close(self._fd)
        self._fd = None
        current.rename(segment)
        self._fd = os.open(current, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        self._written = 0
        return segment

    def discard(self, segment: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            segment.unlink()

    def segments(self) -> list[Path]:
        """This slot's segments, oldest first."""
        return [] if self._dir is None else sorted(self._dir.glob(_SEGMENT_GLOB))

    def pending(self) -> list[tuple[Path, list[bytes]]]:
        """What earlier runs left in this slot (and what was adopted into it): every segment
        and the old current file (rotated first)."""
        self.rotate()
        return [(path, _lines(path)) for path in self.segments()]

    def adopt(self) -> list[tuple[Path, list[bytes]]]:
        """Move the files of every free slot (and of the root's older layout) into this slot
        as new segments; returns them with their lines, oldest first. Safe to call while
        other processes hold slots or adopt at the same time."""
        if self._dir is None:
            return []
        moved: list[Path] = []
        for path in self._root.iterdir() if self._root.is_dir() else ():
            number = _slot_number(path)
            if number is None or path == self._dir:
                continue
            if not _holds_data(path):
                continue
            lock = _try_lock(path)
            if lock is None:  # a live process's slot
                continue
            try:
                moved += self._take(path)
            finally:
                _release(lock)
        moved += self._take(self._root)  # the single-directory layout of older routers
        return [(path, _lines(path)) for path in moved]

    def _take(self, source: Path) -> list[Path]:
        """Rename ``source``'s segments, then its current file, into this slot."""
        files = sorted(source.glob(_SEGMENT_GLOB), key=self._number)
        current = source / CURRENT
        if current.is_file():
            files.append(current)
        taken: list[Path] = []
        for path in files:
            target = self._next_segment()
            try:
                if path.stat().st_size == 0:
                    path.unlink()
                    continue
                path.rename(target)
            except FileNotFoundError:  # another process took it first (the root's files)
                continue
            taken.append(target)
        return taken

    def _next_segment(self) -> Path:
        assert self._dir is not None
        self._seq += 1
        return self._dir / f"segment-{self._seq:09d}.jsonl"

    @staticmethod
    def _number(path: Path) -> int:
        try:
            return int(path.stem.removeprefix("segment-"))
        except ValueError:
            return 0


def _holds_data(slot: Path) -> bool:
    current = slot / CURRENT
    with contextlib.suppress(OSError):
        if current.stat().st_size > 0:
            return True
    return any(slot.glob(_SEGMENT_GLOB))


def _lines(path: Path) -> list[bytes]:
    return [line for line in path.read_bytes().splitlines() if line.strip()]
