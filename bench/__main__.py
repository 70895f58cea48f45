"""``python -m bench run|sweep|setup-peers`` (see bench/README.md)."""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.runner import DEFAULT_REDIS_URL, run_sync
from bench.scenario import SIZES, Scenario, ScenarioError, load, parse
from bench.targets import ALL

RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_TARGETS = ("direct", "bare-proxy", "switchyard-fcfs", "switchyard", "vllm-router",
                   "litellm")  # fmt: skip


def _targets(text: str | None, scenario: Scenario, *, direct: bool = True) -> list[str]:
    names = [t.strip() for t in text.split(",")] if text else list(scenario.targets)
    names = [n for n in (names or DEFAULT_TARGETS) if n]
    unknown = [n for n in names if n not in ALL]
    if unknown:
        raise SystemExit(f"unknown targets: {', '.join(unknown)} (known: {', '.join(ALL)})")
    if direct and "direct" not in names:
        names.insert(0, "direct")  # every comparison is against direct
    return names


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scenario", type=Path, required=True, help="scenario TOML file")
    sizes = ", ".join(SIZES)
    parser.add_argument("--size", default="smoke",
                        help=f"{sizes} or one the scenario adds (%(default)s)")  # fmt: skip
    parser.add_argument("--targets", help=f"comma-separated, from: {', '.join(ALL)}")
    parser.add_argument("--out", type=Path, help="output folder (bench/results/<stamp>)")
    parser.add_argument("--no-pin", action="store_true",
                        help="do not pin routers to one core (taskset)")  # fmt: skip
    parser.add_argument("--no-flame", action="store_true",
                        help="no py-spy flame graphs of the Switchyard routers")  # fmt: skip
    parser.add_argument("--backends-nice", type=int, default=0, metavar="N",
                        help="run the backends at niceness N (> 0), below the load generator "
                        "that shares their cores on a small machine")  # fmt: skip
    parser.add_argument("--no-direct", action="store_true",
                        help="do not add the direct baseline: only for runs compared with "
                        "another run of the same scenario at the same time on the same machine "
                        "(bench/device/multi.sh), which has it")  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run a scenario against the targets")
    _common(run)
    sweep = sub.add_parser("sweep", help="experiment mode: sweep one scenario parameter")
    _common(sweep)
    sweep.add_argument("--param", required=True, help="dotted path, e.g. backends.max_num_seqs")
    sweep.add_argument("--values", required=True, help="comma-separated values")
    sweep.add_argument("--metric", default="ttft_ms.p99",
                       help="dotted path in a target's phase figures (%(default)s)")  # fmt: skip
    sweep.add_argument("--phase", help="phase to read the metric from (default: the last)")
    again = sub.add_parser("report", help="recompute a saved report's comparisons and plots")
    again.add_argument("report", type=Path, help="a report.json written by `run`")
    again.add_argument("--scenario", type=Path,
                       help="scenario file, for reports saved without their scenario")  # fmt: skip
    joined = sub.add_parser("merge", help="one report from simultaneous runs (bench/merge.py)")
    joined.add_argument("reports", type=Path, nargs="+", help="report.json of each run")
    joined.add_argument("--out", type=Path, required=True, help="folder of the merged report")
    peers = sub.add_parser("setup-peers", help="install vllm-router and LiteLLM in venvs")
    peers.add_argument("--only", help="comma-separated peer names")
    peers.add_argument("--latest", action="store_true", help="newest versions, not pinned")
    return parser


def _run_kwargs(args: argparse.Namespace, scenario: Scenario) -> dict[str, Any]:
    return {
        "size": args.size,
        "target_names": _targets(args.targets, scenario, direct=not args.no_direct),
        "redis_url": os.environ.get("REDIS_URL") or DEFAULT_REDIS_URL,
        "command": ["python", "-m", "bench", *sys.argv[1:]],
        "pin": not args.no_pin,
        "flame": not args.no_flame,
        "backends_nice": args.backends_nice,
    }


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.command == "setup-peers":
        from bench.peers import setup_peers  # noqa: PLC0415

        only = args.only.split(",") if args.only else None
        return 1 if any(setup_peers(only, latest=args.latest).values()) else 0
    if args.command == "report":
        return _reanalyse(args.report, args.scenario)
    if args.command == "merge":
        return _merge(args.reports, args.out)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    try:
        scenario = load(args.scenario)
    except (OSError, ScenarioError) as exc:
        raise SystemExit(f"{args.scenario}: {exc}") from None
    out = args.out or RESULTS / f"{stamp}-{scenario.name}-{args.size}"
    if args.command == "run":
        result = run_sync(scenario, out_dir=out, **_run_kwargs(args, scenario))
        _print_summary(result, out)
        return 0
    from bench.sweep import sweep  # noqa: PLC0415

    summary = sweep(
        args.scenario, param=args.param, values=args.values.split(","), metric=args.metric,
        phase=args.phase, out_dir=out, run_one=run_sync, **_run_kwargs(args, scenario),
    )  # fmt: skip
    print(f"sweep of {summary['param']}: {summary['metric_by_target']} -> {out}/sweep.json")
    return 0


def _reanalyse(path: Path, scenario_path: Path | None) -> int:
    from bench import plots, report  # noqa: PLC0415

    saved = json.loads(path.read_text())
    try:
        scenario = load(scenario_path) if scenario_path else parse(saved["scenario_doc"])
    except KeyError:
        raise SystemExit(f"{path} holds no scenario: pass --scenario") from None
    except (OSError, ScenarioError) as exc:
        raise SystemExit(f"scenario: {exc}") from None
    result = report.reanalyse(saved, scenario)
    result["plots"] = plots.plot_report(result, path.parent)
    report.write(result, path.parent)
    _print_summary(result, path.parent)
    return 0


def _merge(paths: Sequence[Path], out: Path) -> int:
    from bench import merge, plots, report  # noqa: PLC0415

    try:
        joined = merge.merge(merge.load_all(paths))
        scenario = parse(joined["scenario_doc"])
    except (OSError, ValueError, KeyError, ScenarioError) as exc:  # MergeError is a ValueError
        raise SystemExit(f"merge: {exc}") from None
    result = report.reanalyse(joined, scenario)
    out.mkdir(parents=True, exist_ok=True)
    result["plots"] = plots.plot_report(result, out)
    report.write(result, out)
    _print_summary(result, out)
    return 0


def _print_summary(result: dict[str, Any], out: Path) -> None:
    print(f"report: {out / 'report.json'}")
    for name, info in result["targets"].items():
        print(f"  {name}: {info['status']}" + (f" ({info['reason'][:200]})"
                                               if info.get("reason") else ""))  # fmt: skip
    for goal, row in result["goals"].items():
        print(f"  goal {goal}: measured {row['measured']} (goal {row['goal']}, met {row['met']})")


if __name__ == "__main__":
    sys.exit(main())
