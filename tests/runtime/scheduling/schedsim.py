"""A discrete-time server model for the scheduling property tests (not collected).

Each slot: requests arriving in that slot are queued; every running request streams up to
``chunk`` output tokens (charged to its tenant as they arrive); then free slots are filled
from the queue, up to ``concurrency`` requests in flight.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from runtime.scheduling.interfaces import QueuedRequest
from runtime.scheduling.queue import PoolQueue


def make_request(
    counter: itertools.count[int],
    *,
    tenant: str,
    input_tokens: int,
    output_tokens: int,
    band: int = 0,
    weight: float = 1.0,
    arrived_at: float = 0.0,
    deadline: float = float("inf"),
    class_name: str = "standard",
    **extra: Any,
) -> QueuedRequest:
    seq = next(counter)
    return QueuedRequest(
        id=f"r{seq}",
        tenant=tenant,
        band=band,
        class_name=class_name,
        input_tokens=input_tokens,
        max_output_tokens=output_tokens,
        seq=seq,
        arrived_at=arrived_at,
        deadline=deadline,
        weight=weight,
        **extra,
    )


@dataclass
class Dispatch:
    req: QueuedRequest
    slot: int
    backlogged_bands: tuple[int, ...]  # bands holding requests just before the pop


@dataclass
class Server:
    """Runs a :class:`PoolQueue` against a model of an engine; records what happened."""

    queue: PoolQueue
    concurrency: int = 1
    chunk: int = 4
    served: dict[str, float] = field(default_factory=dict)  # raw token cost per tenant
    dispatches: list[Dispatch] = field(default_factory=list)
    dispatched: dict[str, int] = field(default_factory=dict)  # requests per tenant
    running: list[tuple[QueuedRequest, int]] = field(default_factory=list)
    slot: int = 0
    on_event: Callable[[Server], None] | None = None

    def _credit(self, tenant: str, amount: float) -> None:
        self.served[tenant] = self.served.get(tenant, 0.0) + amount
        if self.on_event is not None:
            self.on_event(self)

    def arrive(self, requests: Iterable[QueuedRequest]) -> None:
        for req in requests:
            self.queue.push(req)
            if self.on_event is not None:
                self.on_event(self)

    @property
    def idle(self) -> bool:
        return not self.running and not len(self.queue)

    def step(self) -> None:
        still: list[tuple[QueuedRequest, int]] = []
        for req, remaining in self.running:
            k = min(self.chunk, remaining)
            self.queue.charge_output(req, k)
            self._credit(req.tenant, 2.0 * k)
            if remaining - k > 0:
                still.append((req, remaining - k))
        self.running = still
        while len(self.running) < self.concurrency and len(self.queue):
            bands = tuple(sorted(self.queue.band_lengths()))
            req = self.queue.pop()
            assert req is not None
            self.dispatches.append(Dispatch(req, self.slot, bands))
            self.dispatched[req.tenant] = self.dispatched.get(req.tenant, 0) + 1
            self.running.append((req, req.max_output_tokens))
            self._credit(req.tenant, float(req.input_tokens))
        self.slot += 1

    def backlogged(self, tenant: str, band: int = 0) -> bool:
        """Whether ``tenant`` has requests queued in ``band``."""
        return tenant in self.queue.backlogged(band)
