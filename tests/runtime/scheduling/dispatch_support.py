"""Helpers for the dispatcher tests over :class:`~runtime.testing.fleet.HandFleet` (endpoints,
in-flight counts and engine gauges the test sets by hand)."""

from __future__ import annotations

import asyncio

from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Grant, Ticket
from runtime.scheduling.settings import PoolSettings
from runtime.testing.fleet import HandFleet


def dispatcher(fleet: HandFleet, **settings: object) -> PoolDispatcher:
    loop = asyncio.get_running_loop()
    d = PoolDispatcher("p", PoolSettings(**settings), fleet, clock=loop.time, tick_s=0.01)  # type: ignore[arg-type]
    d.start()
    return d


def ticket(tenant: str = "a", *, version: int = 1, band: int = 0, deadline_in: float = 30.0,
           tokens: int = 10, output: int = 10, weight: float = 1.0, shed_order: int = 0,
           class_name: str = "standard") -> Ticket:  # fmt: skip
    return Ticket(
        tenant=tenant, version=version, input_tokens=tokens, max_output_tokens=output, band=band,
        class_name=class_name, shed_order=shed_order, weight=weight,
        deadline=asyncio.get_running_loop().time() + deadline_in,
    )  # fmt: skip


def waiting(d: PoolDispatcher, t: Ticket) -> asyncio.Task[Grant]:
    """Start acquiring in a task (it queues synchronously up to its first wait)."""
    return asyncio.get_running_loop().create_task(d.acquire(t))


async def settle() -> None:
    """Let the tasks started so far run up to their next wait."""
    for _ in range(5):
        await asyncio.sleep(0)


class HandClock:
    """A clock the test moves by hand (``now``), from 0."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Stream:
    """A running stream the take-back may stop (what the gateway's MigratingStream is)."""

    def preemptible(self) -> bool:
        return True

    def preempt(self) -> None:
        """Nothing to stop."""


async def granted(tasks: list[asyncio.Task[Grant]]) -> list[Grant]:
    """Cancel the requests still waiting in ``tasks``; the grants of those that got one."""
    for task in tasks:
        task.cancel()
    await settle()
    return [t.result() for t in tasks if t.done() and not t.cancelled()]
