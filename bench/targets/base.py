"""What every target is: something that answers OpenAI requests on one or more base URLs.

A target starts in front of the run's backends (:meth:`Target.start`), exposes the URLs the
load generator round-robins over, the pids whose CPU and memory are its cost, and stops.
A target that cannot run here (not installed, no Redis) raises :class:`TargetUnavailableError`
with the reason; the run reports it as skipped and goes on.
"""

from __future__ import annotations

import abc
import asyncio
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.procs import Child, StartError
from bench.scenario import Scenario
from config.tls import LocalPKI

REPO_ROOT = Path(__file__).resolve().parents[2]
VENVS = REPO_ROOT / "bench" / ".venvs"


class TargetUnavailableError(Exception):
    """The target cannot run in this environment; the message says why."""


@dataclass
class TargetContext:
    scenario: Scenario
    backend_urls: Sequence[str]
    work_dir: Path
    redis_url: str
    run_id: str
    router_cpus: tuple[int, ...]
    session: aiohttp.ClientSession
    keys: Mapping[str, str]  # tenant -> full API key (sent to every target)
    start_timeout_s: float = 60.0
    pki: LocalPKI | None = None  # the run's local CA (``session`` trusts it): HTTPS targets
    backend_cpus: tuple[int, ...] = ()  # where backends run (a target's own, mTLS ones)
    backend_kv_events: Sequence[str] = ()  # per backend, its KV events address (kv_events on)


@dataclass
class Target(abc.ABC):
    name: str
    children: list[Child] = field(default_factory=list)
    base_urls: list[str] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    auth_token: str | None = None  # sent instead of the tenants' keys (a peer's own key)

    @abc.abstractmethod
    async def start(self, ctx: TargetContext) -> None:
        """Bring the target up in front of ``ctx.backend_urls``; fill ``base_urls``."""

    def pids(self) -> list[int]:
        return [c.proc.pid for c in self.children if c.alive()]

    def alive(self) -> bool:
        return all(c.alive() for c in self.children)

    async def stop(self) -> None:
        children, self.children = self.children, []
        for child in reversed(children):
            await asyncio.to_thread(child.stop)


def python_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Our environment for a Python child run from the repository root."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra or {})
    return env


def python_argv(module: str, *args: str) -> list[str]:
    return [sys.executable, "-m", module, *args]


async def warm_up(
    session: aiohttp.ClientSession,
    url: str,
    *,
    model: str,
    headers: Mapping[str, str],
    count: int,
    timeout_s: float,
    child: Child | None = None,
) -> int:
    """Send small requests until ``count`` succeeded; StartError if none does in time."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "warm up the connection pool"}],
        "max_tokens": 2,
    }
    give_up = time.monotonic() + timeout_s
    done, last = 0, ""
    while done < max(count, 1) and time.monotonic() < give_up:
        if child is not None and not child.alive():
            raise StartError(f"{child.name} exited during warm-up:\n{child.tail()}")
        try:
            async with session.post(
                f"{url.rstrip('/')}/v1/chat/completions",
                json=body,
                headers=headers,
                timeout=aiohttp.ClientTimeout(total=10),
            ) as resp:
                text = await resp.text()
                if resp.status == 200:
                    done += 1
                    continue
                last = f"HTTP {resp.status}: {text[:300]}"
        except (aiohttp.ClientError, TimeoutError) as exc:
            last = repr(exc)
        await asyncio.sleep(0.2)
    if done == 0:
        tail = child.tail() if child is not None else ""
        raise StartError(f"no successful request to {url} in {timeout_s:.0f}s ({last})\n{tail}")
    return done
