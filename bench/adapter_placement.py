"""Adapter loads per 1,000 requests: residency-aware placement against random placement.

``python -m bench.adapter_placement [--requests 20000] [--adapters 20] [--replicas 2]
[--max-loras 4] [--seed 1]`` replays one seeded request stream (adapter popularity Zipf(1.0),
Poisson arrivals at ``--load`` of the fleet's capacity, exponential service times) against
``--replicas`` replicas of ``--max-loras`` slots each (:class:`runtime.workers.adapters.
AdapterSlots`, minimum residency ``--min-residency-s``), twice: placing each request with
:func:`runtime.routing.adapters.adapter_choice` (resident unless saturated, else least load +
load time) and uniformly at random among the replicas (what a router blind to adapters does).
It prints the adapter loads per 1,000 requests of each, their ratio, and the share of requests
that waited for a load. Pure simulation (no engine): the load cost is the real vLLM CPU's
(about 60 ms for the demo adapter, docs/performance/2026-11-26-lora-adapters.md).
"""

from __future__ import annotations

import argparse
import heapq
import random
from collections.abc import Sequence
from dataclasses import dataclass

from runtime.routing.adapters import AllPinned, Choice, ReplicaView, adapter_choice
from runtime.workers.adapters import AdapterSlots, Load, Pinned


@dataclass(frozen=True, kw_only=True)
class Workload:
    requests: int = 20_000
    adapters: int = 20
    replicas: int = 2
    max_loras: int = 4
    capacity: int = 8  # concurrent sequences per replica
    service_s: float = 1.0  # mean request service time
    load: float = 0.7  # offered load as a share of the fleet's capacity
    load_s: float = 0.06  # one adapter load (vLLM CPU, demo adapter)
    min_residency_s: float = 5.0
    seed: int = 1


def _stream(w: Workload) -> list[tuple[float, int, float]]:
    rng = random.Random(w.seed)
    weights = [1.0 / (rank + 1) for rank in range(w.adapters)]  # Zipf(1.0)
    rate = w.load * w.replicas * w.capacity / w.service_s
    now, out = 0.0, []
    for _ in range(w.requests):
        now += rng.expovariate(rate)
        adapter = rng.choices(range(w.adapters), weights)[0]
        out.append((now, adapter, rng.expovariate(1.0 / w.service_s)))
    return out


def run(w: Workload, *, policy: str) -> dict[str, float]:
    """Replay the stream with ``policy`` ("residency" or "random"); loads and waits."""
    rng = random.Random(w.seed + 1)
    slots = [AdapterSlots(max_loras=w.max_loras, min_residency_s=w.min_residency_s)
             for _ in range(w.replicas)]  # fmt: skip
    busy: list[list[float]] = [[] for _ in range(w.replicas)]  # heaps of finish times
    loads = waited = refused = 0
    for now, adapter, service in _stream(w):
        name = f"lora-{adapter}"
        for heap in busy:
            while heap and heap[0] <= now:
                heapq.heappop(heap)
        if policy == "residency":
            views = []
            for i, s in enumerate(slots):
                decision = s.decide(name, now=now) if name not in s else None
                pinned = decision.retry_after_s if isinstance(decision, Pinned) else None
                views.append(ReplicaView(endpoint=i, resident=name in s, in_flight=len(busy[i]),
                                         capacity=w.capacity, load_s=w.load_s,
                                         pinned_for_s=pinned))  # fmt: skip
            choice = adapter_choice(views, service_s=w.service_s)
            if isinstance(choice, AllPinned) or choice is None:
                refused += 1
                continue
            assert isinstance(choice, Choice)
            target = choice.endpoint
        else:
            target = rng.randrange(w.replicas)
        decision = slots[target].decide(name, now=now)
        if isinstance(decision, Pinned):
            refused += 1
            continue
        delay = 0.0
        if isinstance(decision, Load):
            if decision.evict is not None:
                slots[target].unloaded(decision.evict)
            slots[target].loaded(name, now=now)
            loads += 1
            waited += 1
            delay = w.load_s
        heapq.heappush(busy[target], now + delay + service)
    served = w.requests - refused
    return {"loads_per_1k": 1000 * loads / max(served, 1), "waited_share": waited / max(served, 1),
            "refused_share": refused / w.requests}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    for name, default in Workload().__dict__.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    w = Workload(**vars(parser.parse_args(argv)))
    results = {policy: run(w, policy=policy) for policy in ("residency", "random")}
    for policy, figures in results.items():
        print(f"{policy:>10}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items()))
    ratio = results["random"]["loads_per_1k"] / max(results["residency"]["loads_per_1k"], 1e-9)
    print(f"random / residency loads: {ratio:.1f}x")


if __name__ == "__main__":
    main()
