"""``python -m bench.gc_router STATS_FILE [router args]``: ``python -m runtime.gateway`` with
a ``gc.callbacks`` hook switched on by SIGUSR1 and off by SIGUSR2, which writes to
``STATS_FILE`` (JSON) the collections of each generation in that window, the objects they
examined and freed, and how long they took (``perf_counter_ns`` around each), so a bench
measures the collector's share of the request path's CPU (issue #27). Same signals as
:mod:`bench.profiled_router` (the harness's ``SwitchyardTarget(runner=...)``)."""

from __future__ import annotations

import gc
import json
import os
import runpy
import signal
import sys
import time
from types import FrameType
from typing import Any


class GcBook:
    """Collections per generation: count, nanoseconds, objects freed."""

    def __init__(self) -> None:
        self.on = False
        self.started = 0
        self.rows: dict[str, dict[str, int]] = {}

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            self.started = time.perf_counter_ns()
            return
        row = self.rows.setdefault(
            str(info["generation"]), {"collections": 0, "ns": 0, "collected": 0}
        )
        row["collections"] += 1
        row["ns"] += time.perf_counter_ns() - self.started
        row["collected"] += int(info.get("collected", 0))


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    sys.argv = ["runtime.gateway", *args]
    book = GcBook()
    gc.callbacks.append(book)

    def start(_signum: int, _frame: FrameType | None) -> None:
        book.rows = {}
        book.on = True

    def stop(_signum: int, _frame: FrameType | None) -> None:
        book.on = False
        with open(out + ".part", "w", encoding="utf-8") as file:
            json.dump(book.rows, file)
        os.replace(out + ".part", out)  # whole or absent

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    runpy.run_module("runtime.gateway", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
