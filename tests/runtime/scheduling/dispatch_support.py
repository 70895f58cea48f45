"""A small fleet for the dispatcher tests: endpoints, in-flight counts and engine gauges that
the test sets by hand (the real implementation, FleetPlacement, is tested against simulators).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Grant, Ticket
from runtime.scheduling.interfaces import EndpointLoad
from runtime.scheduling.settings import PoolSettings
from runtime.snapshot import EndpointSnap
from runtime.testing.snapshots import endpoint_snap


class HandFleet:
    """Implements the dispatcher's Placement protocol over plain dicts."""

    def __init__(self) -> None:
        self.endpoints: dict[int, EndpointSnap] = {}
        self.inflight: dict[int, int] = {}
        self.loads: dict[int, EndpointLoad] = {}
        self.down: set[int] = set()

    def add(self, endpoint_id: int, *, version: int = 1, capacity: int = 1) -> EndpointSnap:
        endpoint = endpoint_snap(endpoint_id, version, pool="p", capacity=capacity)
        self.endpoints[endpoint_id] = endpoint
        return endpoint

    def candidates(self, version: int, exclude: frozenset[int]) -> Sequence[EndpointSnap]:
        return [
            e
            for e in self.endpoints.values()
            if e.version == version and e.id not in exclude and e.id not in self.down
        ]

    def load(self, endpoint: EndpointSnap) -> tuple[int, EndpointLoad]:
        return self.inflight.get(endpoint.id, 0), self.loads.get(endpoint.id, EndpointLoad())

    def choose(self, endpoints: Sequence[EndpointSnap], affinity_key: str | None) -> EndpointSnap:
        return min(endpoints, key=lambda e: (self.inflight.get(e.id, 0) / e.capacity, e.id))

    def fallback(
        self, version: int, exclude: frozenset[int], affinity_key: str | None
    ) -> EndpointSnap | None:
        found = self.candidates(version, exclude)
        return found[0] if found else None

    def capacity(self) -> int:
        return sum(e.capacity for e in self.endpoints.values() if e.id not in self.down)

    def acquire(self, endpoint_id: int) -> None:
        self.inflight[endpoint_id] = self.inflight.get(endpoint_id, 0) + 1

    def release(self, endpoint_id: int) -> None:
        self.inflight[endpoint_id] -= 1


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
