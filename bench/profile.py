"""The router's profile during a phase: its event loop's lag and a py-spy flame graph.

- **Lag**: the router exports ``switchyard_event_loop_lag_seconds`` (a histogram, see
  :mod:`runtime.telemetry.loop_lag`); the bench scrapes ``/metrics`` before and after each
  phase and reports the phase's own samples: count, p50/p99 (bucket upper bounds) and mean.
- **Flame graph**: ``py-spy record`` (``bench/.venvs/py-spy``, installed by
  ``python -m bench setup-peers``) attached to the router (and its worker processes) for the
  phase, non-blocking, writing ``flame-<target>-<phase>.svg`` next to the report. Without
  py-spy, or when it cannot attach (no ptrace permission), the report says why instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import signal
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import aiohttp

from bench.targets.base import VENVS

LAG_METRIC = "switchyard_event_loop_lag_seconds"
PY_SPY = VENVS / "py-spy" / "bin" / "py-spy"


def parse_lag(text: str) -> dict[str, float]:
    """The lag histogram's cumulative buckets (``le`` -> count), ``_sum`` and ``_count``."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line.startswith(LAG_METRIC):
            continue
        name, _, value = line.rpartition(" ")
        if name.startswith(f"{LAG_METRIC}_bucket"):
            le = name.split('le="', 1)[1].split('"', 1)[0]
            out[le] = out.get(le, 0.0) + float(value)  # summed over worker processes
        elif name.startswith(f"{LAG_METRIC}_sum"):
            out["sum"] = out.get("sum", 0.0) + float(value)
        elif name.startswith(f"{LAG_METRIC}_count"):
            out["count"] = out.get("count", 0.0) + float(value)
    return out


def lag_figures(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, Any]:
    """The phase's lag from two scrapes: samples, p50/p99/max (bucket bounds, ms), mean."""
    count = after.get("count", 0.0) - before.get("count", 0.0)
    if count <= 0:
        return {"samples": 0}
    bounds = sorted((float(le), le) for le in after if le not in ("sum", "count"))
    deltas = [(bound, after[le] - before.get(le, 0.0)) for bound, le in bounds]

    def quantile(q: float) -> float | None:
        for bound, cumulative in deltas:
            if cumulative >= q * count:
                return None if math.isinf(bound) else bound * 1000
        return None

    return {
        "samples": int(count),
        "mean_ms": round((after.get("sum", 0.0) - before.get("sum", 0.0)) / count * 1000, 3),
        "p50_ms_at_most": quantile(0.5),
        "p99_ms_at_most": quantile(0.99),
        "max_ms_at_most": quantile(1.0),
    }


async def scrape_lag(session: aiohttp.ClientSession, base_url: str) -> dict[str, float] | None:
    """The router's lag histogram now, or None when it does not export one."""
    try:
        async with session.get(f"{base_url}/metrics", timeout=aiohttp.ClientTimeout(5)) as r:
            text = await r.text()
    except (aiohttp.ClientError, TimeoutError):
        return None
    found = parse_lag(text)
    return found or None


class FlameGraph:
    """``py-spy record`` on ``pid`` (and its subprocesses) until :meth:`stop`."""

    def __init__(self, pid: int, out: Path, *, rate_hz: int = 100) -> None:
        self.pid = pid
        self.out = out
        self.rate_hz = rate_hz
        self._proc: asyncio.subprocess.Process | None = None
        self.skipped = ""

    async def start(self) -> None:
        if not PY_SPY.exists():
            self.skipped = f"py-spy is not installed ({PY_SPY}; python -m bench setup-peers)"
            return
        argv = [str(PY_SPY), "record", "--pid", str(self.pid), "--output", str(self.out),
                "--format", "flamegraph", "--rate", str(self.rate_hz), "--nonblocking",
                "--subprocesses"]  # fmt: skip
        self._proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE
        )

    async def stop(self) -> dict[str, Any]:
        """Stop sampling (SIGINT: py-spy writes the SVG); the report's entry."""
        proc, self._proc = self._proc, None
        if proc is None:
            return {"skipped": self.skipped}
        if proc.returncode is None:
            proc.send_signal(signal.SIGINT)
        try:
            async with asyncio.timeout(30):
                _, err = await proc.communicate()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            return {"skipped": "py-spy did not finish writing within 30 s"}
        if not self.out.exists():
            reason = (err or b"").decode(errors="replace").strip()[-400:]
            return {"skipped": f"py-spy could not attach or write: {reason or proc.returncode}"}
        return {"svg": self.out.name}
