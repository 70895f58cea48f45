"""bench.syscall_shares: the strace summary by kind and peer, the /proc readers; and
bench.lean_read_micro's read path variants still read."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import uvloop

from bench import lean_read_micro
from bench.syscall_shares import classify, io, medians, summarise_strace, threads

pytestmark = pytest.mark.unit

STRACE = """\
100 getpid()                          = 100
100 write(44<TCP:[127.0.0.1:8000->127.0.0.1:49410]>, ""..., 498) = 498
100 write(30<TCP:[127.0.0.1:53336->127.0.0.1:6379]>, ""..., 95) = 95
100 read(48<TCP:[127.0.0.1:46566->127.0.0.1:9001]>, ""..., 256000) = 2524
100 write(16</tmp/spool/current.jsonl>, ""..., 490) = 490
100 epoll_pwait(6<anon_inode:[eventpoll]>,  <unfinished ...>
101 futex(0x7f, FUTEX_WAIT_BITSET_PRIVATE, 0, NULL, FUTEX_BITSET_MATCH_ANY) = 0
100 <... epoll_pwait resumed>[], 1024, 48, NULL, 8) = 0
100 +++ exited with 0 +++
"""


def test_strace_lines_are_counted_by_kind_peer_and_thread(tmp_path: Path) -> None:
    path = tmp_path / "t.strace"
    path.write_text(STRACE)
    got = summarise_strace(path, main_tids={100}, listen=8000, redis=6379, requests=2)
    assert got["main"] == {
        "getpid": 0.5, "write client": 0.5, "write redis": 0.5, "read backend": 0.5,
        "write file": 0.5, "epoll_pwait eventpoll": 0.5,
    }  # fmt: skip
    assert got["other"] == {"futex": 0.5}


def test_classify_names_the_peer() -> None:
    assert classify("", listen=1, redis=2) == ""
    assert classify("TCP:[127.0.0.1:1->127.0.0.1:5]", listen=1, redis=2) == "client"
    assert classify("TCP:[127.0.0.1:7->127.0.0.1:2]", listen=1, redis=2) == "redis"
    assert classify("anon_inode:[eventfd]", listen=1, redis=2) == "eventfd"


def test_proc_readers_see_this_process() -> None:
    own = threads([os.getpid()])
    assert own["main"]["cpu_ns"] > 0
    assert own["main"]["user_ns"] >= 0
    assert set(io([os.getpid()])) == {"syscr", "syscw"}
    row = {"cpu_us": 1.0, "user_us": 1.0, "sys_us": 0.0, "runq_us": 0.0, "slices": 1.0,
           "vcsw": 1.0, "ivcsw": 0.0}  # fmt: skip
    rounds = [{"cpu_ms_per_request": v, "saturated": False, "threads": {"main": row},
               "io": {"syscr": 1.0}, "redis_commands": {}} for v in (1.0, 3.0, 2.0)]  # fmt: skip
    assert medians(rounds)["cpu_ms_per_request"] == 2.0


def test_lean_read_micro_variants_read() -> None:
    for kind in lean_read_micro.KINDS.values():
        assert uvloop.run(lean_read_micro._reads(kind, 50)) > 0
