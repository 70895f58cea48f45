"""The settlement spool: one slot per process (flock), no process touches another's files, and
the files of a dead process (kill -9 included) are read back by whoever claims or adopts its
slot — exactly once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures.wait import eventually

from runtime.metering.spool import Spool

pytestmark = pytest.mark.unit

REPO_ROOT = Path(__file__).resolve().parents[3]


def opened(root: Path) -> Spool:
    spool = Spool(root)
    spool.open()
    return spool


def lines_of(entries: list[tuple[Path, list[bytes]]]) -> list[bytes]:
    return [line for _path, lines in entries for line in lines]


def test_two_processes_claim_two_slots_and_name_themselves(tmp_path: Path) -> None:
    a, b = opened(tmp_path), opened(tmp_path)  # two open files: flock keeps them apart
    try:
        assert a.directory == tmp_path / "0"
        assert b.directory == tmp_path / "1"
        assert (tmp_path / "0" / "lock").read_text().strip() == str(os.getpid())
    finally:
        a.close()
        b.close()
    again = opened(tmp_path)  # both gave their slots up: the first free one is taken
    assert again.directory == tmp_path / "0"
    again.close()


def test_rotations_of_two_processes_lose_nothing(tmp_path: Path) -> None:
    """The old shared directory lost segments here: both numbered their rotations from the
    same count, and the second rename overwrote the first process's segment."""
    a, b = opened(tmp_path), opened(tmp_path)
    for i in range(3):
        a.append(f"a{i}".encode())
        b.append(f"b{i}".encode())
        assert a.rotate() is not None
        assert b.rotate() is not None
    on_disk = sorted(
        line for spool in (a, b) for path in spool.segments()
        for line in path.read_bytes().splitlines()
    )  # fmt: skip
    assert on_disk == sorted(f"{who}{i}".encode() for who in "ab" for i in range(3))
    for segment in a.segments():  # a discards what it applied: b's files stay
        a.discard(segment)
    assert len(b.segments()) == 3
    a.close()
    b.close()


def test_a_live_process_adopts_a_free_slot_once(tmp_path: Path) -> None:
    a, b = opened(tmp_path), opened(tmp_path)
    b.append(b"b-old")
    assert b.rotate() is not None
    b.append(b"b-current")
    assert a.adopt() == []  # b holds its slot: not a's to take
    b.close()  # b is gone (unflushed: Redis was down)
    adopted = a.adopt()
    assert lines_of(adopted) == [b"b-old", b"b-current"]
    assert all(path.parent == a.directory for path, _ in adopted)
    assert a.adopt() == []  # moved, not copied: nobody replays it again
    assert [line for _p, ls in a.pending() for line in ls] == [b"b-old", b"b-current"]
    c = opened(tmp_path)  # b's slot is free and empty now
    assert c.directory == tmp_path / "1"
    assert c.pending() == []
    a.close()
    c.close()


def test_the_next_claimer_replays_the_slot_and_adopts_the_older_layout(tmp_path: Path) -> None:
    (tmp_path / "segment-000000007.jsonl").write_bytes(b"legacy-seg\n")
    (tmp_path / "current.jsonl").write_bytes(b"legacy-current\n")
    first = opened(tmp_path)
    assert lines_of(first.pending()) == [b"legacy-seg", b"legacy-current"]
    first.append(b"mine")
    first.close()
    second = opened(tmp_path)
    assert second.directory == tmp_path / "0"
    assert lines_of(second.pending()) == [b"legacy-seg", b"legacy-current", b"mine"]
    second.close()


HOLDER = """
import sys, time
from pathlib import Path
from runtime.metering.spool import Spool
spool = Spool(Path(sys.argv[1]))
spool.open()
spool.append(b"seg-1")
spool.rotate()
spool.append(b"cur-1")
print(spool.directory, flush=True)
time.sleep(120)
"""


def test_kill_9_of_the_holder_frees_its_slot_and_keeps_its_lines(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE,
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        held = Path(proc.stdout.readline().decode().strip())
        assert held == tmp_path / "0"
        live = opened(tmp_path)
        assert live.directory == tmp_path / "1"  # slot 0 is held
        assert live.adopt() == []
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        adopted = eventually(live.adopt, timeout=5, what="the dead holder's slot to be adopted")
        assert lines_of(adopted) == [b"seg-1", b"cur-1"]
        live.close()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_an_applied_batch_truncates_the_current_file_in_place(tmp_path: Path) -> None:
    """Issue #27: no rename, open and unlink per flush when nothing was written meanwhile."""
    spool = opened(tmp_path)
    try:
        spool.append(b"a1")
        spool.append(b"a2")
        mark = spool.mark()
        assert spool.applied(mark) is None
        current = tmp_path / "0" / "current.jsonl"
        assert current.stat().st_size == 0
        assert spool.segments() == []
        spool.append(b"b1")  # the next line starts the file over
        assert current.read_bytes() == b"b1\n"
    finally:
        spool.close()


def test_lines_written_after_the_mark_stay_until_applied(tmp_path: Path) -> None:
    spool = opened(tmp_path)
    try:
        spool.append(b"a1")
        mark = spool.mark()
        spool.append(b"b1")  # queued while the batch of a1 was being written
        segment = spool.applied(mark)
        assert segment is not None
        assert segment.read_bytes() == b"a1\nb1\n"  # b1 is not applied yet: kept whole
        assert spool.mark() == 0
        spool.append(b"c1")
        assert spool.applied(spool.mark()) is None  # b1 and c1 applied: the caller discards
        spool.discard(segment)
        assert spool.segments() == []
    finally:
        spool.close()


def test_an_earlier_runs_current_file_is_never_truncated_away(tmp_path: Path) -> None:
    first = opened(tmp_path)
    first.append(b"old")
    first.close()  # killed before its flush: the line is in current.jsonl
    spool = opened(tmp_path)
    try:
        spool.append(b"new")
        assert spool.applied(spool.mark()) is None  # "new" applied
        assert lines_of(spool.pending()) == [b"old"]  # still there, to replay
    finally:
        spool.close()
