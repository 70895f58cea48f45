"""``python -m bench.profiled_router STATS_FILE [router args]``: ``python -m runtime.gateway``
with cProfile switched on by SIGUSR1 and off (its stats written to ``STATS_FILE``) by SIGUSR2,
so a bench profiles only its measured window, not the start. Python runs signal handlers in
the main thread, which is the event loop's: the profiler sees the request path."""

from __future__ import annotations

import cProfile
import os
import runpy
import signal
import sys
from types import FrameType


def main() -> None:
    out, args = sys.argv[1], sys.argv[2:]
    sys.argv = ["runtime.gateway", *args]
    profiler = cProfile.Profile()

    def start(_signum: int, _frame: FrameType | None) -> None:
        profiler.enable()

    def stop(_signum: int, _frame: FrameType | None) -> None:
        profiler.disable()
        profiler.dump_stats(out + ".part")
        os.replace(out + ".part", out)  # whole or absent

    signal.signal(signal.SIGUSR1, start)
    signal.signal(signal.SIGUSR2, stop)
    runpy.run_module("runtime.gateway", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
