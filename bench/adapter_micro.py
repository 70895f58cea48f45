"""CPU cost of the ``adapter`` stage per request.

``python -m bench.adapter_micro [--iterations 50000]`` measures with ``time.process_time``:

- ``base``: a request for a full model (the stage's check, then nothing);
- ``resident``: a request for an adapter already resident on the granted replica (the fleet's
  per-endpoint lookup, the LRU touch).

A load (digest check of the adapter folder + the engine's ``/v1/load_lora_adapter``) is I/O,
not measured here; bench.adapter_placement counts how often it happens.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

from runtime.gateway.bundles import UpstreamDeps
from runtime.gateway.pipeline.context import RequestContext
from runtime.gateway.pipeline.stages.adapter import AdapterResidency
from runtime.snapshot import adapter_name
from runtime.testing.snapshots import SnapshotBuilder
from runtime.workers.adapter_loader import AdapterFleet


async def measure(iterations: int) -> dict[str, float]:
    snapshot = (
        SnapshotBuilder().add_model("base", 1).add_adapter("base-lora", 2, base_version=1)
        .add_endpoint(1, 1).snapshot()
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
                                   ready_snapshot=snapshot)  # fmt: skip
        context = cast(RequestContext, ctx)
        await stage(context)
        start = time.process_time()
        for _ in range(iterations):
            await stage(context)
        result[label] = (time.process_time() - start) / iterations * 1e6
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--iterations", type=int, default=50_000)
    args = parser.parse_args(argv)
    for name, value in asyncio.run(measure(args.iterations)).items():
        print(f"{name:>12}: {value:6.2f} us CPU per request")


if __name__ == "__main__":
    main()
