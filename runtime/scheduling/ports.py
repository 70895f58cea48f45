"""What a pool dispatcher needs from the rest of the router, as narrow interfaces.

- :class:`Placement`: the fleet as the dispatcher sees it — which endpoints of a version are
  usable, how loaded each is, which to choose, and taking and freeing in-flight slots
  (:class:`~runtime.scheduling.placement.FleetPlacement` implements it over routing and
  health; the tests use a hand-driven fleet);
- :class:`CounterSink`: where charged fairness service goes besides the local queue
  (:class:`~runtime.scheduling.shared.SharedCounters`, for the other router replicas).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from runtime.routing.prefix import PromptPrefix
from runtime.scheduling.interfaces import EndpointLoad
from runtime.snapshot import EndpointSnap


class Placement(Protocol):
    """The dispatcher's view of the fleet (implemented over routing and health signals)."""

    def candidates(self, version: int, exclude: frozenset[int]) -> Sequence[EndpointSnap]:
        """Endpoints of ``version`` that pass the pool's filters, room or not."""
        ...

    def load(self, endpoint: EndpointSnap) -> tuple[int, EndpointLoad]:
        """The router's in-flight count on the endpoint, and its scraped engine gauges."""
        ...

    def choose(
        self,
        endpoints: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        adapter: str | None = None,
        prefix: PromptPrefix | None = None,
    ) -> EndpointSnap:
        """One of ``endpoints`` (non-empty) by the pool's scorers and picker, or by the
        request's cached prefix (``prefix``: its prompt's block hashes, when it has them);
        ``adapter``: the engine name of the LoRA adapter the request needs
        (``adapter_residency`` scorer)."""
        ...

    def adapter_room(
        self,
        version: int,
        roomy: Sequence[EndpointSnap],
        adapter: str,
        *,
        waited_s: float,
        typical_wait_s: float,
    ) -> Sequence[EndpointSnap]:
        """Those of ``roomy`` a request for LoRA ``adapter`` may go to now, having waited
        ``waited_s`` in a pool whose requests typically wait ``typical_wait_s`` (the hold
        rule, :func:`runtime.routing.adapters.adapter_room`); empty: it waits."""
        ...

    def prefix_room(
        self,
        roomy: Sequence[EndpointSnap],
        candidates: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        prefix: PromptPrefix | None,
        waited_s: float,
    ) -> Sequence[EndpointSnap]:
        """Those of ``roomy`` (some of ``candidates`` are full) a request may take now, having
        waited ``waited_s``; empty: it waits for a full endpoint that holds its prompt's
        prefix (:meth:`runtime.routing.prefix_placer.PrefixPlacer.room`)."""
        ...

    def fallback(
        self,
        version: int,
        exclude: frozenset[int],
        affinity_key: str | None,
        *,
        prefix: PromptPrefix | None = None,
    ) -> EndpointSnap | None:
        """The routing choice ignoring room (a retry when nothing has room)."""
        ...

    def capacity(self) -> int:
        """The summed capacity of the pool's usable endpoints."""
        ...

    def acquire(self, endpoint_id: int) -> None: ...

    def release(self, endpoint_id: int) -> None: ...


class CounterSink(Protocol):
    """Where charged fairness service goes besides the local queue (other replicas)."""

    def record(self, pool: str, band: int, tenant: str, amount: float) -> None: ...
