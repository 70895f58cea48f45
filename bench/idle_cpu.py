"""An idle router's CPU per second, several checkouts side by side (issue #27).

``python -m bench.idle_cpu [--window 20] [--rounds 6] [--runner bench.staged_router]
NAME=DIR ...`` (with ``REDIS_URL``) starts the ``latency`` scenario's simulator backends and
one harness ``switchyard`` target per ``NAME=DIR`` (``.`` for this checkout), sends them no
request, and takes each router's CPU over the same ``window`` seconds, ``rounds`` times: all
of them idle at once, so the machine's load drifts alike for every checkout, and each window
is a paired comparison. CPU is the sum of ``/proc/<pid>/task/*/schedstat``'s on-CPU
nanoseconds (``/proc/<pid>/stat``'s 10 ms ticks are ±0.5 ms/s over 20 s; this is exact).
Prints one line per window, then per checkout the median and its ratio to the first one's.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from pathlib import Path

from bench.request_profile import rig, start_simulators
from bench.targets.switchyard import SwitchyardTarget


def cpu_ns(pids: list[int]) -> int:
    """On-CPU nanoseconds so far of every thread of ``pids`` (threads that end are lost)."""
    total = 0
    for pid in pids:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                total += int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0])
            except (OSError, ValueError, IndexError):
                continue  # the thread ended meanwhile
    return total


async def measure(args: argparse.Namespace) -> dict[str, list[float]]:
    specs = [spec.split("=", 1) for spec in args.checkouts]
    bench = rig("switchyard-idle-cpu-")
    targets: dict[str, SwitchyardTarget] = {}
    results: dict[str, list[float]] = {name: [] for name, _ in specs}
    try:
        ctx = await start_simulators(bench)
        for i, (name, source) in enumerate(specs):
            target = SwitchyardTarget(name=f"switchyard-{i}",
                                      source=None if source == "." else Path(source),
                                      profile=bench.work / f"idle-{i}.json",
                                      runner=args.runner)  # fmt: skip
            await target.start(ctx)
            targets[name] = target
        await asyncio.sleep(args.settle)
        for window in range(args.rounds):
            before = {name: cpu_ns(t.pids()) for name, t in targets.items()}
            started = time.monotonic()
            await asyncio.sleep(args.window)
            wall = time.monotonic() - started
            line = []
            for name, target in targets.items():
                value = (cpu_ns(target.pids()) - before[name]) / 1e6 / wall
                results[name].append(value)
                line.append(f"{name} {value:.2f}")
            print(f"window {window}: {', '.join(line)} ms/s "
                  f"(load average {os.getloadavg()[0]:.2f})", flush=True)  # fmt: skip
    finally:
        for target in targets.values():
            await target.stop()
        for child in bench.backends:
            await asyncio.to_thread(child.stop)
        await bench.session.close()
    return results


def summary(results: dict[str, list[float]]) -> list[str]:
    """Per checkout: median, spread, and the median of its per-window ratios to the first."""
    first = next(iter(results.values()))
    out = []
    for name, values in results.items():
        ratios = [v / f for v, f in zip(values, first, strict=True) if f > 0]
        out.append(f"{name}: median {statistics.median(values):.2f} ms/s "
                   f"(min {min(values):.2f}, max {max(values):.2f}); per-window ratio to the "
                   f"first, median {statistics.median(ratios):.3f}")  # fmt: skip
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkouts", nargs="+", help="NAME=DIR (DIR '.': this checkout)")
    parser.add_argument("--window", type=float, default=20.0, help="seconds per window (20)")
    parser.add_argument("--rounds", type=int, default=6, help="windows (6)")
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after start (10)")
    parser.add_argument("--runner", default="bench.staged_router",
                        help="the target's wrapper module (bench.staged_router)")  # fmt: skip
    args = parser.parse_args()
    if any("=" not in spec for spec in args.checkouts):
        parser.error("each checkout is NAME=DIR")
    for line in summary(asyncio.run(measure(args))):
        print(line)


if __name__ == "__main__":
    main()
