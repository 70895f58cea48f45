"""An append-only local file of pending settlements (DESIGN §5: nothing is lost).

Every settlement is written here (one ``write(2)``, no fsync: a killed process loses nothing
the kernel already has) before the background task sends it to Redis. A flush first
:meth:`rotate`\\ s the current file into a numbered segment; once Redis has applied the batch
the segment is :meth:`discard`\\ ed. Segments left behind (Redis was down, the router was
killed) are read back by :meth:`pending` at the next start and applied again — the settle
script ignores a lease it already settled, so a replay is harmless.

One directory per router process (``SWITCHYARD_VAR_DIR/usage-spool``): two processes must not
share one.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CURRENT = "current.jsonl"


class Spool:
    __slots__ = ("_dir", "_fd", "_seq")

    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._fd: int | None = None
        self._seq = 0

    def open(self) -> None:
        self._dir.mkdir(parents=True, exist_ok=True)
        self._seq = max((self._number(p) for p in self.segments()), default=0)
        self._fd = os.open(self._dir / CURRENT, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)

    def append(self, line: bytes) -> None:
        """One record (no newline inside), written straight to the kernel."""
        if self._fd is not None:
            os.write(self._fd, line + b"\n")

    def rotate(self) -> Path | None:
        """Close the current file as the next segment and start a new one; None if empty."""
        current = self._dir / CURRENT
        if self._fd is None or os.fstat(self._fd).st_size == 0:
            return None
        self._seq += 1
        segment = self._dir / f"segment-{self._seq:09d}.jsonl"
        os.close(self._fd)
        self._fd = None
        current.rename(segment)
        self._fd = os.open(current, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        return segment

    def discard(self, segment: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            segment.unlink()

    def segments(self) -> list[Path]:
        return sorted(self._dir.glob("segment-*.jsonl"))

    def pending(self) -> list[tuple[Path, list[bytes]]]:
        """What earlier runs left: every segment and the old current file (rotated first)."""
        self.rotate()
        return [
            (path, [line for line in path.read_bytes().splitlines() if line.strip()])
            for path in self.segments()
        ]

    @staticmethod
    def _number(path: Path) -> int:
        try:
            return int(path.stem.removeprefix("segment-"))
        except ValueError:
            return 0
