"""CPU cost of the ``adapter`` stage per request.

``python -m bench.adapter_micro [--iterations 50000]`` measures with ``time.process_time``:

- ``base``: a request for a full model (the stage's check, then nothing);
- ``resident``: a request for an adapter already resident on the granted replica (the fleet's
  per-endpoint lookup, the LRU touch, the pool's slot settings, counting it active and
  registering its release);
- ``score``: the ``adapter_residency`` scorer's part of choosing between two replicas (the
  pool's default selector with the residency book, less the same choice without an adapter);
- ``hold``: the hold rule the dispatcher applies to a request for an adapter before choosing
  (:func:`runtime.routing.adapters.adapter_room` over two replicas with the residency book),
  once per look at the request (more than once while it waits).

A load (digest check of the adapter folder + the engine's ``/v1/load_lora_adapter``) is I/O,
not measured here; bench.adapter_placement counts how often it happens.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Callable, Sequence
from types import SimpleNamespace
from typing import Any, cast

from runtime.gateway.bundles import UpstreamDeps
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.pipeline.stages.adapter import AdapterResidency
from runtime.routing.adapters import adapter_room
from runtime.routing.endpoints import EndpointSelector
from runtime.routing.inflight import InFlight
from runtime.routing.signals import FleetSignals, RequestSignals
from runtime.snapshot import Snapshot, adapter_name
from runtime.testing.snapshots import SnapshotBuilder
from runtime.upstream.breaker import BreakerBook
from runtime.workers.adapter_loader import AdapterFleet


async def measure(iterations: int) -> dict[str, float]:
    snapshot = (
        SnapshotBuilder().add_model("base", 1).add_adapter("base-lora", 2, base_version=1)
        .add_endpoint(1, 1).add_endpoint(3, 1).snapshot()
    )  # fmt: skip
    fleet = AdapterFleet()
    endpoint = snapshot.endpoints[1]
    adapter = snapshot.versions[2]
    fleet.loader(endpoint).slots.loaded(adapter_name(adapter), now=time.monotonic())
    stage = AdapterResidency(cast(UpstreamDeps, SimpleNamespace(adapters=fleet)))
    grant = SimpleNamespace(endpoint=endpoint)
    result: dict[str, float] = {}
    for label, version in (("base_us", snapshot.versions[1]), ("resident_us", adapter)):
        ctx: Any = SimpleNamespace(ready_plan=SimpleNamespace(version=version),
                                   ready_attempts=SimpleNamespace(grant=grant),
                                   ready_snapshot=snapshot, hold=_hold)  # fmt: skip
        context = cast(RequestContext, ctx)
        await stage(context)
        start = time.process_time()
        for _ in range(iterations):
            await stage(context)
        result[label] = (time.process_time() - start) / iterations * 1e6
    result["score_us"] = _score(snapshot, fleet, iterations)
    result["hold_us"] = _hold_rule(snapshot, fleet, iterations)
    return result


def _hold_rule(snapshot: Snapshot, fleet: AdapterFleet, iterations: int) -> float:
    """CPU of the hold rule over two replicas (the adapter resident on one), per call."""
    endpoints = [snapshot.endpoints[1], snapshot.endpoints[3]]
    name = adapter_name(snapshot.versions[2])
    start = time.process_time()
    for _ in range(iterations):
        adapter_room(
            endpoints, endpoints, lambda eid: fleet.adapter_signal(eid, name),
            waited_s=0.0, typical_wait_s=0.5,
        )  # fmt: skip
    return (time.process_time() - start) / iterations * 1e6


def _hold(name: str, release: Callable[[], None], *, early: bool = False) -> None:
    release()  # the request ends at once: what RequestContext.hold runs at its end


def _score(snapshot: Snapshot, fleet: AdapterFleet, iterations: int) -> float:
    """CPU of the adapter_residency scorer in a two-replica choice, per request."""
    endpoints = [snapshot.endpoints[1], snapshot.endpoints[3]]
    fleet.loader(endpoints[1])
    signals = FleetSignals(breakers=BreakerBook(), health=_NoHealth(), inflight=InFlight())  # type: ignore[arg-type]
    selector = EndpointSelector.from_policies({})
    spent = {}
    for adapter in (None, adapter_name(snapshot.versions[2])):
        request = RequestSignals(signals, snapshot, adapter=adapter, residency=fleet)
        start = time.process_time()
        for _ in range(iterations):
            selector.select(endpoints, request)
        spent[adapter] = time.process_time() - start
    return (spent[adapter_name(snapshot.versions[2])] - spent[None]) / iterations * 1e6


class _NoHealth:
    def status(self, endpoint_id: int) -> None:
        return None


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=50_000)
    args = parser.parse_args(argv)
    for name, value in asyncio.run(measure(args.iterations)).items():
        print(f"{name:>12}: {value:6.2f} us CPU per request")


if __name__ == "__main__":
    main()
