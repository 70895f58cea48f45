"""Where a router's CPU goes outside Python, per request, beside the bare proxy (issue #27).

``python -m bench.syscall_shares [--targets switchyard,bare-proxy] [--rounds 3] [--strace]``
starts the targets as ``bench.tls_micro`` does (each router pinned to the last core, the
backends and this load generator on the others) and, per round and target in turn, sends
``rate`` streamed chat completions per second for ``seconds``. Around each round it reads,
for the target's processes and their descendants:

- every thread's on-CPU and run-queue time and its time slices (``/proc/PID/task/TID/schedstat``)
  and its voluntary and involuntary context switches (``.../status``): the main (event loop)
  thread against the others;
- the processes' read and write syscalls (``/proc/PID/io`` ``syscr``/``syscw``);
- the Redis commands its own connections sent (``MONITOR`` on the run's Redis, each command's
  client address mapped to the target's sockets), by command.

All per request. With ``--perf N``, N more rounds per target (in turn) run under ``perf
record``: CPU per request by shared object (the interpreter, the kernel, uvloop, the parsers),
in the cyclic garbage collector, and the top symbols. With ``--strace`` one more round per
target runs under ``strace -f -yy`` (its CPU is not counted: strace slows every syscall and
the load generator opens more connections meanwhile); it gives every syscall by kind and by
peer (the client, a backend, Redis, a file), the event loop's waits (``epoll_wait``: loop
iterations) and the writes per request. Prints one JSON document.

Needs Redis (``REDIS_URL``), like the harness; ``perf`` and ``strace`` for those rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import redis.asyncio as aioredis

from bench.runner import DEFAULT_REDIS_URL
from bench.targets import Target
from bench.tls_micro import Run, paced, running
from runtime.procs import descendant_pids

Counts = dict[str, float]
TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")


def _pids(target: Target) -> list[int]:
    return [p for root in target.pids() for p in (root, *descendant_pids(root))]


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def threads(pids: list[int]) -> dict[str, Counts]:
    """Per thread (``main`` for each process's own, else ``comm#n`` in tid order): on-CPU and
    run-queue ns, time slices, voluntary and involuntary context switches."""
    out: dict[str, Counts] = {}
    for pid in pids:
        tids = sorted(int(t) for t in os.listdir(f"/proc/{pid}/task")) if Path(
            f"/proc/{pid}/task").is_dir() else []  # fmt: skip
        for n, tid in enumerate(tids):
            base = f"/proc/{pid}/task/{tid}"
            sched = _read(f"{base}/schedstat").split()
            stat = _read(f"{base}/stat")
            ticks = stat[stat.rindex(")") + 2 :].split()[11:13] if ")" in stat else ["0", "0"]
            status = dict(line.split(":\t", 1) for line in _read(f"{base}/status").splitlines()
                          if ":\t" in line)  # fmt: skip
            if len(sched) < 3:
                continue
            name = "main" if tid == pid else f"{_read(f'{base}/comm').strip()}#{n}"
            if pid != pids[0]:  # a worker or other child process
                name = f"{pid}:{name}"
            out[name] = {
                "cpu_ns": float(sched[0]), "runq_ns": float(sched[1]), "slices": float(sched[2]),
                "user_ns": float(ticks[0]) * TICK_NS, "sys_ns": float(ticks[1]) * TICK_NS,
                "vcsw": float(status.get("voluntary_ctxt_switches", "0").strip()),
                "ivcsw": float(status.get("nonvoluntary_ctxt_switches", "0").strip()),
            }  # fmt: skip
    return out


def io(pids: Iterable[int]) -> Counts:
    """The processes' ``syscr`` and ``syscw`` summed (their threads included)."""
    total: Counts = {"syscr": 0.0, "syscw": 0.0}
    for pid in pids:
        for line in _read(f"/proc/{pid}/io").splitlines():
            key, _, value = line.partition(": ")
            if key in total:
                total[key] += float(value)
    return dict(total)


def local_ports(pids: Iterable[int]) -> set[int]:
    """The local TCP ports of the processes' sockets (their Redis clients among them)."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in _read(table).splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and cols[9] in inodes:
                ports.add(int(cols[1].rsplit(":", 1)[1], 16))
    return ports


_MONITOR_LINE = re.compile(r'^\S+ \[\d+ [^\]]*:(\d+)\] "([^"]+)"')


class RedisMonitor:
    """Redis ``MONITOR``: every command the server runs, by client port, while running."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.by_port: dict[int, collections.Counter[str]] = collections.defaultdict(
            collections.Counter
        )
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        client = aioredis.Redis.from_url(self._url)
        try:
            async with client.monitor() as monitor:
                async for cmd in monitor.listen():
                    if cmd.get("client_type") != "tcp":  # a script's own calls, a unix socket
                        continue
                    name = str(cmd.get("command", "")).split(" ", 1)[0].upper()
                    self.by_port[int(cmd.get("client_port") or 0)][name] += 1
        finally:
            await client.aclose()  # type: ignore[attr-defined]

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task

    def commands(self, ports: set[int]) -> tuple[Counts, float]:
        """The commands of the clients on ``ports``, by name; the others' count."""
        total: collections.Counter[str] = collections.Counter()
        for port in ports:
            total.update(self.by_port.get(port, {}))
        others = sum(sum(c.values()) for port, c in self.by_port.items() if port not in ports)
        return dict(total), float(others)


def _per(before: Mapping[str, float], after: Mapping[str, float], n: int) -> Counts:
    return {k: round((after.get(k, 0.0) - before.get(k, 0.0)) / n, 3) for k in after}


async def measured_round(run: Run, target: Target, *, rate: float, seconds: float,
                         redis_url: str) -> dict[str, Any]:  # fmt: skip
    """One paced round with the thread, syscall and Redis counters around it."""
    pids = _pids(target)
    monitor = RedisMonitor(redis_url)
    monitor.start()
    await asyncio.sleep(0.2)  # MONITOR is on before the first request
    t0, io0, ports = threads(pids), io(pids), local_ports(pids)
    result = await paced(target, run.session, key=run.key, model=run.model, rate=rate,
                         seconds=seconds)  # fmt: skip
    t1, io1 = threads(pids), io(pids)
    ports |= local_ports(pids)
    await monitor.stop()
    n = max(int(result["ok"]), 1)
    per_thread = {name: _per(t0.get(name, {}), after, n) for name, after in t1.items()}
    for row in per_thread.values():
        for key in ("cpu", "runq", "user", "sys"):
            row[f"{key}_us"] = round(row.pop(f"{key}_ns") / 1000, 2)
    commands, others = monitor.commands(ports)
    redis_cmds = {k: round(v / n, 3) for k, v in sorted(commands.items())}
    return {
        **result, "threads": per_thread, "io": _per(io0, io1, n),
        "redis_commands": redis_cmds, "redis_commands_total": round(sum(redis_cmds.values()), 3),
        "redis_commands_other_clients": round(others / n, 3),
    }  # fmt: skip


_STRACE_LINE = re.compile(r"^(\d+)\s+(\w+)\((?:(\d+)<(.*?)>(?=[,)]))?")
_TCP_PEER = re.compile(r"TCP:\[[^:]*:(\d+)->[^:]*:(\d+)\]")


def classify(fd_desc: str, *, listen: int, redis: int) -> str:
    """A syscall's peer from strace's ``-yy`` fd description."""
    if not fd_desc:
        return ""
    match = _TCP_PEER.search(fd_desc)
    if match is not None:
        local, remote = int(match[1]), int(match[2])
        if local == listen:
            return "client"
        return "redis" if remote == redis else "backend"
    if fd_desc.startswith(("anon_inode:[eventpoll]", "anon_inode:[eventfd]")):
        return fd_desc.split("[", 1)[1].rstrip("]")
    if fd_desc.startswith(("UNIX", "pipe", "TCP")):
        return fd_desc.split(":", 1)[0].lower()
    return "file"


def summarise_strace(path: Path, *, main_tids: set[int], listen: int, redis: int,
                     requests: int) -> dict[str, Any]:  # fmt: skip
    """Per request: syscalls by kind and peer, for the main threads and for the others."""
    counts: dict[str, collections.Counter[str]] = {
        "main": collections.Counter(), "other": collections.Counter()}  # fmt: skip
    for line in path.read_text(errors="replace").splitlines():
        match = _STRACE_LINE.match(line)  # "<... x resumed>", "+++", "---": no match
        if match is None:
            continue  # the second half of an interrupted call is counted at its start
        tid, name, fd_desc = int(match[1]), match[2], match[4] or ""
        peer = classify(fd_desc, listen=listen, redis=redis)
        counts["main" if tid in main_tids else "other"][f"{name} {peer}".strip()] += 1
    return {
        thread: {k: round(v / requests, 2) for k, v in c.most_common()}
        for thread, c in counts.items()
    }


async def straced_round(run: Run, target: Target, *, rate: float, seconds: float,
                        redis_port: int, work: Path) -> dict[str, Any]:  # fmt: skip
    """One paced round with strace attached to every thread of the target (CPU not used)."""
    strace = shutil.which("strace")
    if strace is None:
        return {"skipped": "no strace"}
    pids = _pids(target)
    out = work / f"{target.name}.strace"
    argv = [strace, "-f", "-yy", "-qq", "-s", "0", "-o", str(out)]
    for pid in pids:
        argv += ["-p", str(pid)]
    proc = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.DEVNULL)
    await asyncio.sleep(1.0)  # attached to every thread
    result = await paced(target, run.session, key=run.key, model=run.model, rate=rate,
                         seconds=seconds)  # fmt: skip
    proc.send_signal(signal.SIGINT)
    await proc.wait()
    listen = int(target.base_urls[0].rsplit(":", 1)[1].split("/", 1)[0])
    return {
        "ok": result["ok"],
        "per_request": summarise_strace(out, main_tids=set(pids), listen=listen,
                                        redis=redis_port, requests=max(int(result["ok"]), 1)),
    }  # fmt: skip


PERF_HZ = 1999
# The cyclic garbage collector's own functions (CPython 3.11's gcmodule.c and the traversals)
_GC_SYMBOLS = re.compile(
    r"\b(gc_collect_main|visit_decref|visit_reachable|subtract_refs|update_refs|move_unreachable|"
    r"deduce_unreachable|move_legacy_finalizers|\w*_traverse\w*|\w*traverse)\b"
)
_PERF_ROW = re.compile(r"^\s*[\d.]+%\s+(\d+)\s+(.+?)\s*$")


async def _perf_rows(data: Path, sort: str) -> list[tuple[int, str]]:
    """(samples, key) rows of ``perf report --sort sort``, most first."""
    proc = await asyncio.create_subprocess_exec(
        "perf", "report", "-i", str(data), "-n", "--sort", sort, "--stdio",
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    out, _ = await proc.communicate()
    rows = []
    for line in out.decode(errors="replace").splitlines():
        match = _PERF_ROW.match(line)
        if match is not None and not line.lstrip().startswith("#"):
            rows.append((int(match[1]), " ".join(match[2].split())))
    return rows


async def perfed_round(run: Run, target: Target, *, rate: float, seconds: float,
                       work: Path, top: int = 25) -> dict[str, Any]:  # fmt: skip
    """One paced round under ``perf record`` (every thread of the target): on-CPU µs per
    request by shared object (the interpreter, the kernel, uvloop, the parsers) and the top
    symbols. Sampling at ~2 kHz slows the router little; its numbers are shares, read with
    the measured rounds' CPU."""
    if shutil.which("perf") is None:
        return {"skipped": "no perf"}
    data = work / f"{target.name}.perf"
    argv = ["perf", "record", "-q", "-F", str(PERF_HZ), "-o", str(data),
            "-p", ",".join(str(p) for p in _pids(target))]  # fmt: skip
    proc = await asyncio.create_subprocess_exec(*argv, stderr=asyncio.subprocess.DEVNULL)
    await asyncio.sleep(0.5)
    result = await paced(target, run.session, key=run.key, model=run.model, rate=rate,
                         seconds=seconds)  # fmt: skip
    proc.send_signal(signal.SIGINT)
    await proc.wait()
    n = max(int(result["ok"]), 1)

    def per_request(samples: int) -> float:
        return round(samples / PERF_HZ / n * 1e6, 1)

    dsos = await _perf_rows(data, "dso")
    symbols = await _perf_rows(data, "dso,sym")
    return {
        "ok": result["ok"],
        "us_per_request_total": per_request(sum(s for s, _ in dsos)),
        "us_per_request_gc": per_request(sum(s for s, k in symbols if _GC_SYMBOLS.search(k))),
        "us_per_request_by_dso": {k: per_request(v) for v, k in dsos if per_request(v) >= 1},
        "top_symbols_us": {k: per_request(v) for v, k in symbols[:top]},
    }


def medians(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Per thread and counter, the median over the rounds that were not saturated."""
    kept = [r for r in rounds if not r["saturated"]] or rounds
    out: dict[str, Any] = {
        "cpu_ms_per_request": statistics.median(r["cpu_ms_per_request"] for r in kept),
        "kept_rounds": len(kept),
    }
    names = {name for r in kept for name in r["threads"]}
    out["threads"] = {
        name: {key: round(statistics.median(r["threads"].get(name, {}).get(key, 0.0)
                                            for r in kept), 2)
               for key in ("cpu_us", "user_us", "sys_us", "runq_us", "slices", "vcsw", "ivcsw")}
        for name in sorted(names)
    }  # fmt: skip
    for field in ("io", "redis_commands"):
        keys = {k for r in kept for k in r[field]}
        out[field] = {
            k: statistics.median(r[field].get(k, 0.0) for r in kept) for k in sorted(keys)
        }
    return out


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    redis_url = os.environ.get("REDIS_URL", DEFAULT_REDIS_URL)
    redis_port = int(redis_url.rsplit(":", 1)[1].split("/", 1)[0])
    work = Path(tempfile.mkdtemp(prefix="switchyard-syscalls-"))
    rounds: dict[str, list[dict[str, Any]]] = {}
    traced: dict[str, dict[str, Any]] = {}
    perfed: dict[str, list[dict[str, Any]]] = {}
    async with running(args.targets, args.baseline) as run:
        rounds = {target.name: [] for target in run.targets}
        for _ in range(args.rounds):
            for target in run.targets:
                rounds[target.name].append(
                    await measured_round(
                        run, target, rate=args.rate, seconds=args.seconds, redis_url=redis_url
                    )
                )
                print(target.name, json.dumps(rounds[target.name][-1]), file=sys.stderr,
                      flush=True)  # fmt: skip
                await asyncio.sleep(1.0)  # the backends drain
        for _ in range(args.perf):
            for target in run.targets:
                perfed.setdefault(target.name, []).append(await perfed_round(
                    run, target, rate=args.rate, seconds=args.seconds, work=work))  # fmt: skip
                await asyncio.sleep(1.0)
        if args.strace:
            for target in run.targets:
                traced[target.name] = await straced_round(
                    run, target, rate=args.rate, seconds=args.seconds, redis_port=redis_port,
                    work=work)  # fmt: skip
                await asyncio.sleep(1.0)
    return {
        "rate_rps": args.rate, "seconds": args.seconds, "rounds": rounds,
        "medians": {name: medians(rs) for name, rs in rounds.items()},
        "perf": perfed, "strace": traced, "load_average": os.getloadavg(),
        "when": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.syscall_shares", description=__doc__)
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s (100)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per round (10)")
    parser.add_argument("--rounds", type=int, default=3, help="per target (3)")
    parser.add_argument(
        "--targets",
        default="switchyard,bare-proxy",
        help="comma-separated harness targets (switchyard,bare-proxy)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="also run each Switchyard target from this checkout",
    )
    parser.add_argument(
        "--strace",
        action="store_true",
        help="one more round per target under strace -f -yy (syscalls by kind)",
    )
    parser.add_argument(
        "--perf",
        type=int,
        default=0,
        help="this many more rounds per target under perf record (CPU by shared object, "
        "symbol, and in the garbage collector)",
    )
    print(json.dumps(asyncio.run(main_async(parser.parse_args())), indent=2))


if __name__ == "__main__":
    main()
