"""The garbage collector's time per request in the real router (issue #27).

``python -m bench.request_gc [--rate 100] [--seconds 10] [--rounds 3] [--baseline DIR]``
starts the ``latency`` scenario's simulator backends and the harness's ``switchyard`` target
(one worker, pinned as the harness pins it) under :mod:`bench.gc_router`, sends ``rate``
streamed chat completions per second for ``seconds`` (:func:`bench.tls_micro.paced`) with the
``gc.callbacks`` hook on for that window only, and prints per request: the collections of
each generation and the microseconds they took, with the router's CPU per request from
``/proc``. ``--baseline DIR`` runs the checkout at ``DIR`` the same way (``bench/gc_router.py``
and ``bench/profiled_router.py`` are copied there); the rounds alternate A B B A on fresh routers.

Needs Redis (``REDIS_URL``), like the harness.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
from pathlib import Path
from typing import Any

from bench.request_profile import profile


async def measure(args: argparse.Namespace, source: Path | None, out: Path) -> dict[str, Any]:
    result = await profile(args, source, out, runner="bench.gc_router")
    rows = json.loads(await asyncio.to_thread(out.read_text))
    types = rows.pop("types", None)
    answered = max(1, int(result["ok"]))
    result["gc_us_per_request"] = round(sum(row["ns"] for row in rows.values()) / 1e3 / answered, 2)
    result["by_generation"] = {
        generation: {
            "collections_per_request": round(row["collections"] / answered, 3),
            "us_per_request": round(row["ns"] / 1e3 / answered, 2),
            "us_each": round(row["ns"] / 1e3 / max(1, row["collections"]), 1),
        }
        for generation, row in sorted(rows.items())
    }
    if types is not None:
        result["young_types_per_collection"] = {
            name: round(count / max(1, rows["0"]["collections"]), 1)
            for name, count in types.items()
        }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.request_gc", description=__doc__)
    parser.add_argument("--rate", type=float, default=100.0, help="requests/s (100)")
    parser.add_argument("--seconds", type=float, default=10.0, help="(10)")
    parser.add_argument("--rounds", type=int, default=1, help="(1)")
    parser.add_argument("--baseline", type=Path, default=None, help="also run this checkout")
    parser.add_argument("--out", type=Path, default=Path("router-gc.json"))
    parser.add_argument(
        "--types",
        action="store_true",
        help="diagnostic: the youngest generation's object types (slow)",
    )
    args = parser.parse_args()
    if args.types:
        os.environ["GC_ROUTER_TYPES"] = "1"  # the router inherits it
    if args.baseline is not None:  # the router's wrapper, as this checkout has it
        for name in ("gc_router.py", "profiled_router.py"):
            shutil.copy(Path(__file__).with_name(name), args.baseline / "bench")
    sources: list[Path | None] = [None] if args.baseline is None else [None, args.baseline]
    found: dict[str, list[float]] = {str(source or "this checkout"): [] for source in sources}
    for _ in range(args.rounds):
        for source in sources:
            name = str(source or "this checkout")
            result = asyncio.run(measure(args, source, args.out.resolve()))
            found[name].append(result["gc_us_per_request"])
            print(f"== {name}: {json.dumps(result)}", flush=True)
        sources.reverse()  # A B, B A, ...
    for name, values in found.items():
        shown = " / ".join(f"{value:.1f}" for value in values)
        print(f"{name}: GC {shown} us per request (median {statistics.median(values):.1f})")


if __name__ == "__main__":
    main()
