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
from collections.abc import Callable
from types import FrameType


def serve(start: Callable[[], None], stop: Callable[[str], None]) -> None:
    """Run the router (``sys.argv``: ``STATS_FILE`` then its arguments): ``start()`` on
    SIGUSR1, ``stop(part)`` on SIGUSR2, which writes the stats to ``part``, then renamed to
    ``STATS_FILE`` (whole or absent)."""
    out, args = sys.argv[1], sys.argv[2:]
    sys.argv = ["runtime.gateway", *args]

    def on_start(_signum: int, _frame: FrameType | None) -> None:
        start()

    def on_stop(_signum: int, _frame: FrameType | None) -> None:
        stop(out + ".part")
        os.replace(out + ".part", out)

    signal.signal(signal.SIGUSR1, on_start)
    signal.signal(signal.SIGUSR2, on_stop)
    runpy.run_module("runtime.gateway", run_name="__main__", alter_sys=True)


def main() -> None:
    profiler = cProfile.Profile()

    def stop(part: str) -> None:
        profiler.disable()
        profiler.dump_stats(part)

    serve(profiler.enable, stop)


if __name__ == "__main__":
    main()
