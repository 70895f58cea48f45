"""Adapter loads per 1,000 requests and TTFT: the router's placement against random placement.

``python -m bench.adapter_placement [--requests 20000] [--adapters 20] [--replicas 2]
[--capacity 4] [--max-loras 4] [--max-cpu-loras 14] [--min-residency-s 10] [--load 0.7]
[--seed 1]`` replays one seeded request stream (adapter popularity Zipf(1.0), Poisson arrivals
at ``--load`` of the fleet's capacity, exponential service times) against ``--replicas``
simulated engines, each with ``--capacity`` sequences, ``--max-cpu-loras`` resident adapters
(:class:`runtime.workers.adapters.AdapterSlots`, minimum residency ``--min-residency-s``) and
at most ``--max-loras`` distinct adapters in one batch (vLLM's scheduler holds back a request
whose adapter would be one too many until a running one finishes). Requests wait in a queue
like the dispatcher's, one tenant per adapter (a tenant's fine-tune): the first request that
may go is placed when an engine has a free sequence, and a tenant's head that may not go holds
back only that tenant's later requests. The policies:

- ``hold``: the router as it is: the adapters' hold rule
  (:func:`runtime.routing.adapters.adapter_room`, over :class:`~runtime.routing.adapters.
  RecentWaits` of this queue's waits), then the pool selector with its default scorers
  (``least_load,adapter_residency:10``, :mod:`runtime.routing.endpoints`), fed the residency
  book as :class:`runtime.workers.adapter_loader.AdapterFleet` keeps it (resident or loading,
  the measured load time, all slots pinned, the batch's adapters);
- ``residency``: the same selector without the hold rule (the router before it);
- ``least_load``: the selector with ``least_load`` alone (blind to adapters);
- ``random``: uniformly at random among the engines with room.

A request for an adapter not resident on its engine loads it there (``--load-s``, about 60 ms
for the demo adapter on vLLM CPU, docs/performance/2026-11-26-lora-adapters.md), evicting the
least recently used adapter past its minimum residency; a request finding every slot pinned is
refused (429). The same stream with no adapters (base-model requests, ``least_load``) gives the
TTFT the goal compares with. TTFT is the time to the request's first step, plus ``--prefill-s``.
Pure simulation (no engine, no network): it exercises the product's rule, scorer and LRU, not
I/O.
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from runtime.routing.adapters import AdapterSignal, RecentWaits, adapter_room
from runtime.routing.endpoints import EndpointSelector
from runtime.snapshot import EndpointSnap
from runtime.testing.snapshots import endpoint_snap
from runtime.workers.adapters import AdapterSlots, Load, Pinned

POLICIES = ("hold", "residency", "least_load", "random")


@dataclass(frozen=True, kw_only=True)
class Workload:
    requests: int = 20_000
    adapters: int = 20
    replicas: int = 2
    max_loras: int = 4  # distinct adapters in one batch (vLLM --max-loras)
    max_cpu_loras: int = 14  # adapters resident per replica (vLLM --max-cpu-loras)
    capacity: int = 4  # concurrent sequences per replica (vLLM --max-num-seqs)
    service_s: float = 1.0  # mean request service time
    load: float = 0.7  # offered load as a share of the fleet's capacity
    load_s: float = 0.06  # one adapter load (vLLM CPU, demo adapter)
    prefill_s: float = 0.05  # added to every TTFT
    min_residency_s: float = 10.0
    seed: int = 1


@dataclass
class _Request:
    arrived: float
    adapter: str | None
    service: float
    ready_at: float = 0.0


@dataclass
class _Engine:
    endpoint: EndpointSnap
    slots: AdapterSlots
    loading: dict[str, float] = field(default_factory=dict)  # adapter -> load done at
    running: Counter[str | None] = field(default_factory=Counter)
    waiting: list[_Request] = field(default_factory=list)  # granted, held by the LoRA limit
    in_flight: int = 0
    granted: Counter[str] = field(default_factory=Counter)  # the router's in flight per adapter


class _Signals:
    """The router's signals over the simulated engines, for one request (EndpointSignals)."""

    def __init__(self, engines: dict[int, _Engine], w: Workload) -> None:
        self.engines = engines
        self.w = w
        self.adapter_name: str | None = None
        self.now = 0.0

    def breaker_available(self, endpoint_id: int) -> bool:
        return True

    def healthy(self, endpoint_id: int) -> bool:
        return True

    def inflight(self, endpoint_id: int) -> int:
        return self.engines[endpoint_id].in_flight

    def kv_usage(self, endpoint_id: int) -> float | None:
        return None

    def cost_per_hour(self, endpoint: EndpointSnap) -> float | None:
        return None

    def affinity_key(self) -> str | None:
        return None

    def cached_prefix(self, endpoint_id: int) -> float | None:
        return None

    def adapter_or_none(self, endpoint_id: int) -> AdapterSignal:
        found = self.adapter(endpoint_id)
        assert found is not None
        return found

    def adapter(self, endpoint_id: int) -> AdapterSignal | None:
        name = self.adapter_name
        if name is None:
            return None
        engine = self.engines[endpoint_id]
        active = engine.granted[name]
        full = active == 0 and sum(1 for n in engine.granted.values() if n) >= self.w.max_loras
        if name in engine.slots or engine.loading.get(name, 0.0) > self.now:
            return AdapterSignal(resident=True, load_s=self.w.load_s, active=active,
                                 batch_full=full)  # fmt: skip
        pinned = engine.slots.pinned_for(now=self.now) is not None
        return AdapterSignal(resident=False, load_s=self.w.load_s, pinned=pinned,
                             batch_full=full)  # fmt: skip


def _stream(w: Workload, *, adapters: bool) -> list[_Request]:
    rng = random.Random(w.seed)
    weights = [1.0 / (rank + 1) for rank in range(w.adapters)]  # Zipf(1.0)
    rate = w.load * w.replicas * w.capacity / w.service_s
    now, out = 0.0, []
    for _ in range(w.requests):
        now += rng.expovariate(rate)
        rank = rng.choices(range(w.adapters), weights)[0]
        service = rng.expovariate(1.0 / w.service_s)
        out.append(_Request(arrived=now, adapter=f"lora-{rank}" if adapters else None,
                            service=service))  # fmt: skip
    return out


class _Sim:
    def __init__(self, w: Workload, policy: str) -> None:
        self.w = w
        self.policy = policy
        self.rng = random.Random(w.seed + 1)
        self.engines = {
            i: _Engine(
                endpoint_snap(i, 1, capacity=w.capacity),
                AdapterSlots(capacity=w.max_cpu_loras, min_residency_s=w.min_residency_s),
            )
            for i in range(1, w.replicas + 1)
        }
        scorers = "least_load" if policy == "least_load" else None  # hold: the defaults too
        self.selector = EndpointSelector.from_policies({"scorers": scorers} if scorers else {})
        self.signals = _Signals(self.engines, w)
        self.events: list[tuple[float, int, int, _Request | None]] = []  # (t, seq, engine, req)
        self.seq = 0
        self.queue: list[_Request] = []
        self.waits = RecentWaits()  # the dispatcher's recent queue waits (the hold rule's)
        self.loads = self.refused = self.waited_load = 0
        self.ttft: list[float] = []

    def _push(self, t: float, engine: int, req: _Request | None) -> None:
        self.seq += 1
        heapq.heappush(self.events, (t, self.seq, engine, req))

    def _choose(self, req: _Request, now: float) -> _Engine | None:
        roomy = [e for e in self.engines.values() if e.in_flight < self.w.capacity]
        if not roomy:
            return None
        if self.policy == "random":
            return roomy[self.rng.randrange(len(roomy))]
        self.signals.adapter_name, self.signals.now = req.adapter, now
        endpoints = [e.endpoint for e in roomy]
        if self.policy == "hold" and req.adapter is not None:
            everyone = [e.endpoint for e in self.engines.values()]
            endpoints = adapter_room(
                endpoints, everyone, self.signals.adapter_or_none,
                waited_s=now - req.arrived, typical_wait_s=self.waits.quantile(),
            )  # fmt: skip
            if not endpoints:
                return None
        if len(endpoints) == 1:
            return self.engines[endpoints[0].id]
        chosen = self.selector.select(endpoints, self.signals)
        assert chosen is not None
        return self.engines[chosen.id]

    def _next(self, now: float) -> tuple[int, _Engine] | None:
        """The first queued request that may go now, and where: the dispatcher's queue, one
        tenant per adapter (a tenant's fine-tune), whose head that cannot go holds back only
        its own tenant's later requests."""
        blocked: set[str | None] = set()
        for index, req in enumerate(self.queue):
            if req.adapter in blocked:
                continue
            engine = self._choose(req, now)
            if engine is not None:
                return index, engine
            if not any(e.in_flight < self.w.capacity for e in self.engines.values()):
                return None
            blocked.add(req.adapter)
        return None

    def _place(self, req: _Request, engine: _Engine, now: float) -> None:
        name = req.adapter
        req.ready_at = now
        if name is not None:
            others = (e for e in self.engines.values() if e is not engine)
            spare = {a for e in others for a in e.slots.resident()}
            decision = engine.slots.decide(name, now=now, spare=spare)
            if isinstance(decision, Pinned):
                self.refused += 1
                return
            if isinstance(decision, Load):
                if decision.evict is not None:
                    engine.slots.unloaded(decision.evict)
                engine.slots.loaded(name, now=now)
                engine.loading[name] = now + self.w.load_s
                self.loads += 1
            done = engine.loading.get(name, 0.0)
            if done > now:
                self.waited_load += 1
                req.ready_at = done
        engine.in_flight += 1
        if name is not None:
            engine.granted[name] += 1
        engine.waiting.append(req)
        self._push(req.ready_at, engine.endpoint.id, None)  # try to start it when ready

    def _start_ready(self, engine: _Engine, now: float) -> None:
        for req in list(engine.waiting):
            if req.ready_at > now:
                continue
            distinct = sum(1 for a, n in engine.running.items() if a is not None and n > 0)
            fits = req.adapter is None or engine.running[req.adapter] > 0
            if not fits and distinct >= self.w.max_loras:
                continue
            engine.waiting.remove(req)
            engine.running[req.adapter] += 1
            self.ttft.append(now - req.arrived + self.w.prefill_s)
            self._push(now + req.service, engine.endpoint.id, req)

    def run(self, stream: list[_Request]) -> dict[str, float]:
        arrivals = iter(stream)
        upcoming = next(arrivals, None)
        while upcoming is not None or self.events:
            if upcoming is not None and (not self.events or upcoming.arrived <= self.events[0][0]):
                now, req = upcoming.arrived, upcoming
                upcoming = next(arrivals, None)
                self.queue.append(req)
            else:
                now, _, eid, done = heapq.heappop(self.events)
                engine = self.engines[eid]
                if done is not None:  # a request finished
                    engine.running[done.adapter] -= 1
                    engine.in_flight -= 1
                    if done.adapter is not None:
                        engine.granted[done.adapter] -= 1
                self._start_ready(engine, now)
            while self.queue:
                found = self._next(now)
                if found is None:
                    break
                index, engine = found
                req = self.queue.pop(index)
                self.waits.add(now - req.arrived)
                self._place(req, engine, now)
                self._start_ready(engine, now)
        served = max(len(self.ttft), 1)
        ttft = sorted(self.ttft)
        return {
            "loads_per_1k": 1000 * self.loads / served,
            "waited_load_share": self.waited_load / served,
            "refused_share": self.refused / len(stream),
            "ttft_p50_s": statistics.median(ttft) if ttft else 0.0,
            "ttft_p95_s": ttft[min(len(ttft) - 1, int(0.95 * len(ttft)))] if ttft else 0.0,
        }


def run(w: Workload, *, policy: str, adapters: bool = True) -> dict[str, float]:
    """Replay the stream with ``policy`` (one of :data:`POLICIES`); base requests when not
    ``adapters``."""
    return _Sim(w, policy).run(_stream(w, adapters=adapters))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    for name, default in Workload().__dict__.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(default), default=default)
    w = Workload(**vars(parser.parse_args(argv)))
    base = run(w, policy="least_load", adapters=False)
    print(f"{'base':>10}: ttft_p50_s {base['ttft_p50_s']:.3f}, ttft_p95_s {base['ttft_p95_s']:.3f}")
    results = {policy: run(w, policy=policy) for policy in POLICIES}
    for policy, figures in results.items():
        ratio = figures["ttft_p95_s"] / max(base["ttft_p95_s"], 1e-9)
        print(f"{policy:>10}: " + ", ".join(f"{k} {v:.3f}" for k, v in figures.items())
              + f", ttft_p95 / base {ratio:.2f}")  # fmt: skip
    for ours in ("hold", "residency"):
        loads = results[ours]["loads_per_1k"]
        for peer in ("random", "least_load"):
            ratio = results[peer]["loads_per_1k"] / max(loads, 1e-9)
            print(f"{peer} / {ours} loads: {ratio:.1f}x")


if __name__ == "__main__":
    main()
