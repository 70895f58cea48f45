"""``python -m bench.gc_router STATS_FILE [router args]``: ``python -m runtime.gateway`` with
a ``gc.callbacks`` hook switched on by SIGUSR1 and off by SIGUSR2, which writes to
``STATS_FILE`` (JSON) the collections of each generation in that window, the objects they
freed, and the CPU time they took (``thread_time_ns`` around each, the event loop's thread),
so a bench measures the collector's share of the request path's CPU (issue #27). Same
signals as :mod:`bench.profiled_router` (the harness's ``SwitchyardTarget(runner=...)``)."""

from __future__ import annotations

import gc
import json
import os
import time
from collections import Counter
from typing import Any

from bench.profiled_router import serve


class GcBook:
    """Collections per generation: count, nanoseconds, objects freed; with ``types``, the
    types of the objects in the youngest generation when each of its collections starts
    (what it walks; a diagnostic: it slows the router, its timings are not results)."""

    def __init__(self, *, types: bool = False) -> None:
        self.on = False
        self.started = 0
        self.rows: dict[str, dict[str, int]] = {}
        self.types: Counter[str] | None = Counter() if types else None

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self.on:
            return
        if phase == "start":
            if self.types is not None and info["generation"] == 0:
                self.types.update(_name(o) for o in gc.get_objects(generation=0))
            self.started = time.thread_time_ns()
            return
        row = self.rows.setdefault(
            str(info["generation"]), {"collections": 0, "ns": 0, "collected": 0}
        )
        row["collections"] += 1
        row["ns"] += time.thread_time_ns() - self.started
        row["collected"] += int(info.get("collected", 0))


def _name(thing: object) -> str:
    kind = type(thing)
    if kind.__name__ in ("function", "coroutine", "cell", "method", "frame"):
        code = getattr(thing, "__code__", None) or getattr(thing, "cr_code", None)
        if code is not None:
            return f"{kind.__name__} {code.co_filename.rsplit('/', 2)[-1]}:{code.co_name}"
    return f"{kind.__module__}.{kind.__qualname__}"


def main() -> None:
    book = GcBook(types=bool(os.environ.get("GC_ROUTER_TYPES")))
    gc.callbacks.append(book)

    def start() -> None:
        book.rows = {}
        if book.types is not None:
            book.types.clear()
        book.on = True

    def stop(part: str) -> None:
        book.on = False
        found: dict[str, Any] = dict(book.rows)
        if book.types is not None:
            found["types"] = dict(book.types.most_common(60))
        with open(part, "w", encoding="utf-8") as file:
            json.dump(found, file)

    serve(start, stop)


if __name__ == "__main__":
    main()
