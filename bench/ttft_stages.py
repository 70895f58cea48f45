"""Where the router's time before the first byte goes, stage by stage (issue #27).

``python -m bench.ttft_stages [--rate 20] [--seconds 10] [--rounds 2] [--baseline DIR]
[--idle 5] [--json FILE]`` starts the ``latency`` scenario's simulator backends and the
harness's ``switchyard`` target (one worker, pinned like the harness pins it) under
:mod:`bench.staged_router`, which times every inference request's rows (the loop's scheduling
of the request task, the body read, each pipeline stage, the relay until its first byte, the
releases and the accounting after the last byte) and counts the Redis commands and tasks each
stage causes. Each round sends ``rate`` streamed chat completions per second for ``seconds``,
every other one to the router and the rest straight to a backend, and takes the client's
time to the first content token of both (the router's added TTFT in the same seconds), the
router's CPU per request (``/proc``) and the stage rows. ``--baseline DIR`` runs the checkout
at ``DIR`` the same way, its rounds alternating with ours (ABBA) (copy this file and
``bench/staged_router.py`` into it, and ``bench/targets/switchyard.py``'s ``runner``).
``--idle S``: the router's CPU per second with no request at all for ``S`` seconds (its
background tasks), before the rounds.

Prints one table per checkout: per row the wall p50 / p90 / mean and thread-CPU mean in
microseconds; the rows before the first byte summed; then the counts. Needs Redis
(``REDIS_URL``), like the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.procs import CpuSampler
from bench.request_profile import rig, start_simulators
from bench.targets.switchyard import SwitchyardTarget

PRE_FIRST_BYTE_AFTER = "relay->first byte"  # the last row before the first byte


async def _ttft(session: aiohttp.ClientSession, url: str, key: str, model: str) -> float | None:
    """Seconds to the first content token of one streamed chat completion (None: failed)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hello " * 40}],
            "max_tokens": 8, "stream": True}  # fmt: skip
    started = time.perf_counter()
    first: float | None = None
    try:
        async with session.post(
            f"{url}/v1/chat/completions", json=body,
            headers={"Authorization": f"Bearer {key}"}, timeout=aiohttp.ClientTimeout(total=30),
        ) as resp:  # fmt: skip
            async for line in resp.content:
                if first is None and line.startswith(b"data:") and b'"content":"' in line:
                    first = time.perf_counter() - started
            return first if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError):
        return None


async def _round(
    target: SwitchyardTarget, direct: list[str], session: aiohttp.ClientSession, out: Path,
    *, key: str, model: str, rate: float, seconds: float,
) -> dict[str, Any]:  # fmt: skip
    """One window: every other request to the router, the rest straight to a backend."""
    [pid] = target.pids()
    await asyncio.to_thread(out.unlink, missing_ok=True)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    os.kill(pid, signal.SIGUSR1)
    sampler = asyncio.create_task(CpuSampler(target.pids()).run(stop))
    count = int(rate * seconds)
    start = loop.time() + 0.05
    lags: list[float] = []
    routed: list[asyncio.Task[float | None]] = []
    straight: list[asyncio.Task[float | None]] = []
    for i in range(count):
        at = start + i / rate
        await asyncio.sleep(max(0.0, at - loop.time()))
        lags.append((loop.time() - at) * 1000)
        if i % 2 == 0:
            routed.append(asyncio.create_task(_ttft(session, target.base_urls[0], key, model)))
        else:
            url = direct[(i // 2) % len(direct)]
            straight.append(asyncio.create_task(_ttft(session, url, key, model)))
    router_ttft = await asyncio.gather(*routed)
    direct_ttft = await asyncio.gather(*straight)
    stop.set()
    usage = await sampler
    os.kill(pid, signal.SIGUSR2)
    for _ in range(100):
        if await asyncio.to_thread(out.exists):
            break
        await asyncio.sleep(0.1)
    stages = json.loads(await asyncio.to_thread(out.read_text))
    ok = [t for t in router_ttft if t is not None]
    ok_direct = [t for t in direct_ttft if t is not None]
    return {
        "router_ttft": ok, "direct_ttft": ok_direct, "sent": len(routed),
        "router_cpu_ms_per_request": 1000 * usage.cpu_s / max(1, len(ok)),
        "send_lag_p99_ms": statistics.quantiles(lags, n=100)[98] if len(lags) > 1 else 0.0,
        "stages": stages,
    }  # fmt: skip


async def _idle(target: SwitchyardTarget, seconds: float) -> float:
    """The router's CPU milliseconds per second with no request."""
    stop = asyncio.Event()
    sampler = asyncio.create_task(CpuSampler(target.pids()).run(stop))
    await asyncio.sleep(seconds)
    stop.set()
    usage = await sampler
    return 1000 * usage.cpu_s / usage.wall_s


async def measure(args: argparse.Namespace) -> dict[str, list[dict[str, Any]]]:
    bench = rig("switchyard-ttft-stages-")
    scenario, session, keys, work = bench.scenario, bench.session, bench.keys, bench.work
    sources: dict[str, Path | None] = {"this checkout": None}
    if args.baseline is not None:
        sources["baseline"] = args.baseline
    targets: dict[str, SwitchyardTarget] = {}
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in sources}
    try:
        ctx = await start_simulators(bench)
        for i, (name, source) in enumerate(sources.items()):
            target = SwitchyardTarget(name=f"switchyard-{i}", source=source,
                                      profile=work / f"stages-{i}.json",
                                      runner="bench.staged_router")  # fmt: skip
            await target.start(ctx)
            targets[name] = target
        key = next(iter(keys.values()))
        model = scenario.backends.model
        direct = [b.base_url for b in bench.backends]
        for name, target in targets.items():
            if args.idle > 0:
                idle = await _idle(target, args.idle)
                print(f"{name}: idle CPU {idle:.1f} ms/s", flush=True)
                results[name].append({"idle_cpu_ms_per_s": idle})
        for turn in range(args.rounds):
            order = list(targets.items())
            for name, target in order if turn % 2 == 0 else order[::-1]:  # ABBA: no order bias
                assert target.profile is not None
                await _round(target, direct, session, target.profile, key=key, model=model,
                             rate=args.rate, seconds=1.0)  # fmt: skip  # warm
                result = await _round(target, direct, session, target.profile, key=key,
                                      model=model, rate=args.rate,
                                      seconds=args.seconds)  # fmt: skip
                results[name].append(result)
                print(f"{name}: {summary_line(result)}", flush=True)
                await asyncio.sleep(1.0)
    finally:
        for target in targets.values():
            await target.stop()
        for child in bench.backends:
            await asyncio.to_thread(child.stop)
        await session.close()
    return results


def _pct(values: list[float], q: int) -> float:
    if len(values) < 2:
        return values[0] if values else 0.0
    return statistics.quantiles(values, n=100)[q - 1]


def summary_line(result: dict[str, Any]) -> str:
    router, direct = result["router_ttft"], result["direct_ttft"]
    if not router or not direct:
        return "no answers"
    added50 = 1000 * (_pct(router, 50) - _pct(direct, 50))
    added99 = 1000 * (_pct(router, 99) - _pct(direct, 99))
    return (f"{len(router)}/{result['sent']} ok, added TTFT p50 {added50:+.2f} ms p99 "
            f"{added99:+.2f} ms, router CPU {result['router_cpu_ms_per_request']:.2f} ms/req, "
            f"send lag p99 {result['send_lag_p99_ms']:.1f} ms")  # fmt: skip


def _row(name: str, walls: list[float], cpus: list[float]) -> str:
    return (f"{name:<20} {len(walls):>6} {_pct(walls, 50):9.1f} {_pct(walls, 90):9.1f} "
            f"{statistics.fmean(walls):9.1f} {statistics.fmean(cpus):9.1f}")  # fmt: skip


def _counts(label: str, counts: dict[str, int], per: int) -> str:
    return f"{label}: " + ", ".join(f"{k} {v / per:.2f}" for k, v in sorted(counts.items()))


def table(rounds: list[dict[str, Any]]) -> str:
    """The stage rows of every round together: wall p50 / p90 / mean, CPU mean (µs)."""
    walls: dict[str, list[float]] = {}
    cpus: dict[str, list[float]] = {}
    requests = 0
    redis: dict[str, int] = {}
    tasks: dict[str, int] = {}
    connects: dict[str, int] = {}
    collections: dict[str, list[float]] = {}
    pre_wall: list[float] = []
    pre_cpu: list[float] = []
    for result in rounds:
        if "stages" not in result:
            continue
        data = result["stages"]
        for trace in data["traces"]:
            requests += 1
            wall_sum = cpu_sum = 0.0
            before = trace["first_byte"] is not None
            for name, wall, cpu in trace["rows"]:
                walls.setdefault(name, []).append(wall / 1000)
                cpus.setdefault(name, []).append(cpu / 1000)
                if before and not name.startswith("("):  # "(relay) ...": inside a later row
                    wall_sum += wall / 1000
                    cpu_sum += cpu / 1000
                if name == PRE_FIRST_BYTE_AFTER:
                    before = False
            if trace["first_byte"] is not None:
                pre_wall.append(wall_sum)
                pre_cpu.append(cpu_sum)
        for stage, n in data["redis_commands"].items():
            redis[stage] = redis.get(stage, 0) + n
        for stage, n in data["tasks_created"].items():
            tasks[stage] = tasks.get(stage, 0) + n
        for generation, pauses in data.get("gc_ms", {}).items():
            collections.setdefault(generation, []).extend(pauses)
        for stage, n in data.get("upstream_connects", {}).items():
            connects[stage] = connects.get(stage, 0) + n
    lines = [f"{'row':<20} {'n':>6} {'wall p50':>9} {'p90':>9} {'mean':>9} {'cpu mean':>9}"]
    lines += [_row(name, values, cpus[name]) for name, values in walls.items()]
    if pre_wall:
        lines.append(_row("before first byte", pre_wall, pre_cpu))
    per = max(1, requests)
    lines.append(_counts("redis commands per request", redis, per))
    lines.append(_counts("tasks per request", tasks, per))
    lines.append(_counts("upstream connections opened per request", connects, per))
    lines.append("gc per request (generation: collections, ms total, ms max): " + ", ".join(
        f"{g}: {len(v) / per:.2f}, {sum(v) / per:.3f}, {max(v):.2f}"
        for g, v in sorted(collections.items())
    ))  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.ttft_stages", description=__doc__)
    parser.add_argument("--rate", type=float, default=20.0, help="requests/s, both halves (20)")
    parser.add_argument("--seconds", type=float, default=10.0, help="per round (10)")
    parser.add_argument("--rounds", type=int, default=2, help="per checkout (2)")
    parser.add_argument("--baseline", type=Path, default=None, help="also run this checkout")
    parser.add_argument("--idle", type=float, default=0.0, help="idle CPU window, s (0: none)")
    parser.add_argument("--json", type=Path, default=None, help="write every sample here")
    args = parser.parse_args()
    results = asyncio.run(measure(args))
    if args.json is not None:
        args.json.write_text(json.dumps(results))
    for name, rounds in results.items():
        print(f"\n== {name}")
        for result in rounds:
            if "stages" in result:
                print(summary_line(result))
        print(table(rounds))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
