"""A fleet held in plain dicts, implementing the dispatcher's ``Placement`` protocol, for tests
and the benchmark: endpoints, in-flight counts and engine gauges that the caller sets by hand
(and, for LoRA adapters, a residency book: the hold rule applies as in the router).

The production implementation (``runtime.routing`` fleet placement) is tested against
simulators; this one lets the scheduler run without any network (the dispatcher tests,
``bench.dispatch_micro`` and ``bench.dispatch_sim``).
"""

from __future__ import annotations

from collections.abc import Sequence

from runtime.routing.adapters import ResidencyBook, adapter_room
from runtime.routing.prefix import PromptPrefix
from runtime.scheduling.interfaces import EndpointLoad
from runtime.snapshot import EndpointSnap
from runtime.testing.snapshots import endpoint_snap


class HandFleet:
    """Endpoints by id; ``down`` ones are not candidates; the least loaded is chosen."""

    def __init__(self) -> None:
        self.endpoints: dict[int, EndpointSnap] = {}
        self.inflight: dict[int, int] = {}
        self.loads: dict[int, EndpointLoad] = {}
        self.down: set[int] = set()
        self.residency: ResidencyBook | None = None  # where adapters are (the hold rule)

    def add(
        self, endpoint_id: int, *, version: int = 1, capacity: int = 1, pool: str = "p"
    ) -> EndpointSnap:
        endpoint = endpoint_snap(endpoint_id, version, pool=pool, capacity=capacity)
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

    def choose(
        self,
        endpoints: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        adapter: str | None = None,
        prefix: PromptPrefix | None = None,
    ) -> EndpointSnap:
        return min(endpoints, key=lambda e: (self.inflight.get(e.id, 0) / e.capacity, e.id))

    def adapter_room(
        self,
        version: int,
        roomy: Sequence[EndpointSnap],
        adapter: str,
        *,
        waited_s: float,
        typical_wait_s: float,
    ) -> Sequence[EndpointSnap]:
        book = self.residency
        if book is None:
            return roomy
        return adapter_room(
            roomy, self.candidates(version, frozenset()),
            lambda eid: book.adapter_signal(eid, adapter),
            waited_s=waited_s, typical_wait_s=typical_wait_s,
        )  # fmt: skip

    def prefix_room(
        self,
        roomy: Sequence[EndpointSnap],
        candidates: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        prefix: PromptPrefix | None,
        waited_s: float,
    ) -> Sequence[EndpointSnap]:
        return roomy  # no prefix index: never holds

    def fallback(
        self,
        version: int,
        exclude: frozenset[int],
        affinity_key: str | None,
        *,
        prefix: PromptPrefix | None = None,
    ) -> EndpointSnap | None:
        found = self.candidates(version, exclude)
        return found[0] if found else None

    def capacity(self) -> int:
        return sum(e.capacity for e in self.endpoints.values() if e.id not in self.down)

    def acquire(self, endpoint_id: int) -> None:
        self.inflight[endpoint_id] = self.inflight.get(endpoint_id, 0) + 1

    def release(self, endpoint_id: int) -> None:
        self.inflight[endpoint_id] -= 1
