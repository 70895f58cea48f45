"""What a request's TTFT is made of on the shared-prefix scenario, in virtual time (issue #35).

``python -m bench.prefix_ttft [--scenario bench/scenarios/prefix.toml] [--size medium]
[--phase load-8] [--seeds 35] [--ways load,prefix,oracle]`` plays the phase through
:mod:`bench.dispatch_sim` (the scheduler, the engines as the simulator worker runs them:
whole, unchunked prefills) once per placement ``way`` and splits every request's TTFT into:

- ``queue``: in the router's queue, from arrival to its grant;
- ``wait``: from its grant to the start of the engine step that takes it in (the rest of the
  step in flight), split into that step's share of prefill (``wait_pf``: other requests'
  prefills, in proportion to the step's prefill time) and the rest (``wait_dec``); a request
  that waits through several steps (a full batch) is split by the last one's share;
- ``own``: its own uncached prefill in the step that takes it in;
- ``others``: the other newcomers' prefills in that same step;
- ``decode``: that step's decode part (``decode_a_ms + decode_b_ms * batch``).

The five add up to the TTFT. It prints per way the TTFT p50 and p95 and the components' means
over all requests and over the middle fifth (the 40th-60th percentile of TTFT: what makes the
p50), and the TTFT p50 over load-only's per seed. The ways:

- ``load``: load-only routing (the least in flight over capacity);
- ``prefix``: the router's placer as it is (:class:`~runtime.routing.prefix_placer.PrefixPlacer`
  and the sticky rule, ``--policy KEY=VALUE`` sets its pool policies);
- ``oracle``: a myopic oracle no router has: each request goes to the endpoint where its own
  TTFT is least, knowing each engine's exact state (when its step in flight ends, what its
  prefix cache holds, who waits to be taken in); not the future's arrivals;
- ``score:K``: a rule a router can apply, from what it knows (its index's cached tokens and
  its own queued prefill per endpoint): the endpoint with the least ``queued + K x uncached``
  estimated tokens (ties: the least in flight);
- ``prefix-light``: the sticky rule, and where it routes by load, the least queued prefill
  (ties: the least in flight) instead of the least in flight;
- ``prefix-arrival``: the placer as it was before 2026-11-27 (c): the prefix hold's
  ``hold_ms`` counted from the request's arrival, so a request that waited that long in the
  router's queue (past capacity: all of them) never holds.

Past capacity the harness counts only the requests answered in full by ``drain_timeout_s``
after the phase's last send (the rest are cancelled at drain, :mod:`bench.loadgen`); the
summary also prints each way's figures counted so (:func:`harness_view`).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.dispatch_sim import _Run, play
from bench.prefix_placement import Mode, PrefixFleet
from bench.scenario import Scenario, load
from bench.sim_engine import Seq
from bench.workload import chat_messages, plan_phase
from runtime.routing.prefix import PromptPrefix
from runtime.routing.sticky import StickyRule
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.settings import PoolSettings
from runtime.snapshot import EndpointSnap
from runtime.workers.simulator.prefix_cache import (
    PrefixCache,
    PrefixCacheConfig,
    render_chat,
    text_block_hashes,
)
from runtime.workers.simulator.text import count_chat_tokens
from runtime.workers.simulator.timing import TimingModel

COMPONENTS = ("queue", "wait_pf", "wait_dec", "own", "others", "decode")
WAYS = ("load", "prefix", "oracle", "prefix-light", "prefix-arrival")


def check_way(way: str) -> str:
    """``way`` if it names a way of the module docstring, else ``ValueError``."""
    if way in WAYS:
        return way
    name, _, weight = way.partition(":")
    try:
        ok = name == "score" and float(weight) >= 0
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"unknown way {way!r}: one of {', '.join(WAYS)} or score:K (K >= 0)")
    return way


@dataclass(frozen=True, slots=True)
class Parts:
    """One request's TTFT, split (the module docstring), in seconds."""

    ttft: float
    queue: float
    wait_pf: float
    wait_dec: float
    own: float
    others: float
    decode: float
    arrived: float = 0.0  # since its phase's start
    done: float = float("inf")  # its last token, since its phase's start
    tenant: str = ""


@dataclass(slots=True)
class _Step:
    start: float = 0.0
    duration: float = 0.0
    prefill_s: float = 0.0


class WayFleet(PrefixFleet):
    """The prefix fleet with the ways of the module docstring (``way``) in ``choose``."""

    def __init__(self, *, way: str, now: Callable[[], float], rule: StickyRule | None) -> None:
        mode: Mode = "load" if way == "load" else "prefix"
        super().__init__(mode=mode, now=now, rule=rule)
        self.way = check_way(way)
        self.run: DecomposedRun | None = None

    def prefix_room(
        self,
        roomy: Sequence[EndpointSnap],
        candidates: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        prefix: PromptPrefix | None,
        waited_s: float,
    ) -> Sequence[EndpointSnap]:
        if self.way == "prefix-arrival" and waited_s * 1000.0 >= self.placer.rule.hold_ms:
            return roomy  # the hold's clock started at the request's arrival
        return super().prefix_room(
            roomy, candidates, affinity_key, prefix=prefix, waited_s=waited_s
        )

    def choose(
        self,
        endpoints: Sequence[EndpointSnap],
        affinity_key: str | None,
        *,
        adapter: str | None = None,
        prefix: PromptPrefix | None = None,
    ) -> EndpointSnap:
        if self.way in ("load", "prefix", "prefix-arrival") or affinity_key is None:
            return super().choose(endpoints, affinity_key, adapter=adapter, prefix=prefix)
        prefix = prefix or self._expected.pop(affinity_key)
        match = self.placer.match(prefix, endpoints)
        placer, inflight = self.placer, self.inflight

        def load(e: EndpointSnap) -> tuple[float, int]:
            return inflight.get(e.id, 0) / e.capacity, e.id

        if self.way == "oracle":
            assert self.run is not None
            run = self.run
            chosen = min(endpoints, key=lambda e: (run.ttft_at(e.id, affinity_key), load(e)))
        elif self.way.startswith("score:"):
            k = float(self.way.split(":", 1)[1])
            matched = match.matched
            chosen = min(endpoints, key=lambda e: (
                placer.queued_prefill(e.id) + k * prefix.uncached_tokens(matched.get(e.id, 0)),
                load(e),
            ))  # fmt: skip
        else:  # prefix-light
            found = placer.sticky(endpoints, match, lambda i: inflight.get(i, 0))
            chosen = found or min(endpoints, key=lambda e: (placer.queued_prefill(e.id), load(e)))
        self.placer.sent(chosen.id, prefix, match)
        self._sent[affinity_key] = prefix
        return chosen


class DecomposedRun(_Run):
    """``bench.dispatch_sim``'s run with placement ``way``, recording each request's TTFT
    parts."""

    def __init__(
        self, scenario: Scenario, settings: PoolSettings, way: str, rule: StickyRule | None
    ) -> None:
        super().__init__(scenario, settings, "load" if way == "load" else "prefix", rule)
        fleet = WayFleet(way=way, now=self.clock, rule=rule)
        fleet.run = self
        for endpoint_id in self.engines:
            fleet.add(endpoint_id, capacity=scenario.backends.max_num_seqs)
        self.prefix = fleet  # in place of the run's own, before the dispatcher starts
        self.dispatcher = PoolDispatcher("p", settings, fleet, clock=self.clock, tick_s=3600.0)
        self.steps: dict[int, _Step] = {}  # endpoint -> its step in flight (or the last)
        self.parts: dict[str, list[Parts]] = {}  # phase -> requests
        # id(seq) -> its parts but the queue, from the step that takes it in to its token
        self.pending: dict[int, tuple[float, float, float, float, float]] = {}
        self.open: dict[int, tuple[str, Parts]] = {}  # id(seq) -> its parts, until its end

    def step(self, endpoint_id: int) -> None:
        engine = self.engines[endpoint_id]
        before = {id(s) for s in engine.waiting}
        last = self.steps.get(endpoint_id, _Step())
        super().step(endpoint_id)
        now = self.clock.now
        total = sum(chunk for _, chunk in engine.plan)
        batch = len(engine.plan)
        decode = self.timing.decode_step_seconds(batch)
        self.steps[endpoint_id] = _Step(
            start=now, duration=self.timing.prefill_seconds(total) + decode,
            prefill_s=self.timing.prefill_seconds(total),
        )  # fmt: skip
        for seq, chunk in engine.plan:
            if id(seq) not in before:
                continue
            wait = now - seq.started_at
            share = last.prefill_s / last.duration if last.duration > 0 else 0.0
            wait_pf = min(wait, max(0.0, wait * share))
            own = self.timing.prefill_seconds(chunk)
            others = self.timing.prefill_seconds(total - chunk)
            self.pending[id(seq)] = (wait_pf, wait - wait_pf, own, others, decode)

    def step_ended(self, endpoint_id: int, phase: str) -> None:
        engine = self.engines[endpoint_id]
        fresh = [s for s, _ in engine.plan if not s.started]
        running = list(engine.running)
        super().step_ended(endpoint_id, phase)
        for seq in fresh:
            if seq.started:
                self._record(phase, seq)
        ended = set(map(id, running)) - set(map(id, engine.running))
        for key in ended & self.open.keys():
            phase_of, parts = self.open.pop(key)
            done = self.clock.now - self.flow[phase_of].start
            self.parts.setdefault(phase_of, []).append(dataclasses.replace(parts, done=done))

    def _record(self, phase: str, seq: Seq) -> None:
        wait_pf, wait_dec, own, others, decode = self.pending.pop(id(seq))
        self.open[id(seq)] = (phase, Parts(
            ttft=self.clock.now - seq.arrived, queue=seq.started_at - seq.arrived,
            wait_pf=wait_pf, wait_dec=wait_dec, own=own, others=others, decode=decode,
            arrived=seq.arrived - self.flow[phase].start, tenant=seq.planned.tenant,
        ))  # fmt: skip

    def ttft_at(self, endpoint_id: int, key: str) -> float:
        """The oracle: the request's TTFT if it went to ``endpoint_id`` now."""
        engine = self.engines[endpoint_id]
        now = self.clock.now
        step = self.steps.get(endpoint_id, _Step())
        rest = max(0.0, step.start + step.duration - now) if engine.stepping else 0.0
        tokens, hashes = self.rendered[key]
        cache = engine.cache
        assert cache is not None
        prefill = tokens - cache.hit_tokens(hashes, tokens)
        for seq in engine.waiting:
            prefill += seq.prompt_tokens - cache.hit_tokens(seq.block_hashes, seq.prompt_tokens)
        batch = len(engine.running) + len(engine.waiting) + 1
        return rest + self.timing.prefill_seconds(prefill) + self.timing.decode_step_seconds(batch)


def decompose(
    scenario: Scenario, settings: PoolSettings, phase_s: float, way: str, rule: StickyRule | None,
) -> dict[str, list[Parts]]:  # fmt: skip
    """Every phase's requests' TTFT parts with placement ``way``."""
    run = DecomposedRun(scenario, settings, way, rule)
    asyncio.run(play(run, phase_s=phase_s))
    return run.parts


def floor_p50(scenario: Scenario, phase_s: float, phase: str) -> float:
    """The TTFT p50 (ms) no placement can beat: every request's uncached prefill if every
    engine held every earlier prompt of the phase (one unbounded cache, arrival order), plus
    a decode step of a batch of one, and no wait."""
    backends = scenario.backends
    spec = next(p for p in scenario.phases if p.name == phase)
    plan = plan_phase(scenario, spec, duration_s=phase_s, max_requests=100_000)
    cache = PrefixCache(PrefixCacheConfig(block_size=backends.block_size, capacity_blocks=1 << 30))
    timing = TimingModel(
        prefill_tps=backends.prefill_tps, decode_a_ms=backends.decode_a_ms,
        decode_b_ms=backends.decode_b_ms,
    )  # fmt: skip
    floors = []
    for planned in plan.requests:
        rendered = render_chat([(m["role"], m["content"]) for m in chat_messages(planned)])
        tokens = count_chat_tokens([m["content"] for m in chat_messages(planned)])
        hit = cache.admit(text_block_hashes(rendered, backends.block_size), tokens)
        floors.append(timing.prefill_seconds(tokens - hit) + timing.decode_step_seconds(1))
    return 1000 * _p(floors, 0.5)


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def summary(parts: Sequence[Parts]) -> tuple[float, float, dict[str, float], dict[str, float]]:
    """TTFT p50, p95 (ms) and the components' means (ms) over all and the middle fifth."""
    ttfts = [p.ttft for p in parts]
    lo, hi = _p(ttfts, 0.4), _p(ttfts, 0.6)
    middle = [p for p in parts if lo <= p.ttft <= hi]

    def means(rows: Sequence[Parts]) -> dict[str, float]:
        return {c: 1000 * statistics.fmean(getattr(p, c) for p in rows) for c in COMPONENTS}

    return 1000 * _p(ttfts, 0.5), 1000 * _p(ttfts, 0.95), means(parts), means(middle)


@dataclass(frozen=True, slots=True)
class Counted:
    """One phase of one way as the harness counts it (:mod:`bench.loadgen`,
    :mod:`bench.metrics`): only the requests answered in full by ``drain_s`` after the
    phase's last send count (the rest are cancelled at drain), goodput is those within the
    SLO over the phase's length; ``served`` the requests finished within the phase, per s."""

    p50_ms: float
    ok: int
    sent: int
    goodput_rps: float
    served_rps: float


def harness_view(
    parts: Sequence[Parts], sent: int, phase_s: float, drain_s: float, slo_ms: float
) -> Counted:
    """``parts`` counted as the harness does (see :class:`Counted`)."""
    ok = [p for p in parts if p.done <= phase_s + drain_s]
    met = sum(1 for p in ok if 1000 * p.ttft <= slo_ms)
    served = sum(1 for p in parts if p.done <= phase_s)
    return Counted(
        p50_ms=1000 * _p([p.ttft for p in ok], 0.5), ok=len(ok), sent=sent,
        goodput_rps=met / phase_s, served_rps=served / phase_s,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.prefix_ttft")
    parser.add_argument("--scenario", type=Path, default=Path("bench/scenarios/prefix.toml"))
    parser.add_argument("--size", default="medium", help="whose phase_duration_s to use")
    parser.add_argument("--phase", action="append", default=[], help="default: load-8")
    parser.add_argument("--seeds", default="35")
    parser.add_argument("--ways", default="load,prefix,oracle")
    parser.add_argument("--policy", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--detail", action="store_true", help="the components per seed")
    args = parser.parse_args(argv)
    scenario = load(args.scenario)
    size = scenario.size(args.size)
    phase_s = size.phase_duration_s
    settings = PoolSettings.from_policies(dict(scenario.switchyard.policies), ())
    policies = dict(item.partition("=")[::2] for item in args.policy)
    try:
        rule = StickyRule.from_policies(policies, strict=True)
    except ValueError as exc:
        parser.error(str(exc))
    phases = args.phase or ["load-8"]
    try:
        ways = [check_way(w) for w in args.ways.split(",")]
        seeds = [int(s) for s in args.seeds.split(",")]
    except ValueError as exc:
        parser.error(str(exc))
    unknown = set(phases) - {p.name for p in scenario.phases}
    if unknown:
        parser.error(f"no phase {', '.join(sorted(unknown))} in {scenario.name}")
    p50: dict[str, dict[str, list[float]]] = {ph: {w: [] for w in ways} for ph in phases}
    slo = scenario.classes[scenario.report.slo_class].ttft_slo_ms
    shares: dict[str, dict[str, list[float]]] = {ph: {w: [] for w in ways} for ph in phases}
    counted: dict[str, dict[str, list[Counted]]] = {ph: {w: [] for w in ways} for ph in phases}
    floors: dict[str, list[float]] = {ph: [] for ph in phases}
    for seed in seeds:
        seeded = dataclasses.replace(scenario, seed=seed)
        sent = {ph.name: len(plan_phase(seeded, ph, duration_s=phase_s,
                                        max_requests=100_000).requests)
                for ph in seeded.phases if ph.name in phases}  # fmt: skip
        for phase in phases:
            floors[phase].append(floor_p50(seeded, phase_s, phase))
        for way in ways:
            parts = decompose(seeded, settings, phase_s, way, rule)
            for phase in phases:
                rows = parts.get(phase, [])
                mid, p95, every, middle = summary(rows)
                p50[phase][way].append(mid)
                shares[phase][way].append(
                    sum(1 for r in rows if 1000 * r.ttft <= slo) / max(sent[phase], 1)
                )
                counted[phase][way].append(
                    harness_view(rows, sent[phase], phase_s, size.drain_timeout_s, slo)
                )
                if args.detail or len(seeds) == 1:
                    print(f"seed {seed} {phase} {way:14} p50 {mid:6.1f} p95 {p95:6.1f} ms | "
                          + " ".join(f"{c} {every[c]:5.1f}" for c in COMPONENTS) + " | middle: "
                          + " ".join(f"{c} {middle[c]:5.1f}" for c in COMPONENTS))  # fmt: skip
                    print("    TTFT p50 per tenant: " + ", ".join(
                        f"{t} {1000 * _p([r.ttft for r in rows if r.tenant == t], 0.5):.0f} ms"
                        for t in sorted({r.tenant for r in rows})
                    ))  # fmt: skip
    for phase in phases:
        report(
            phase, ways=ways, seeds=seeds, p50=p50[phase], shares=shares[phase],
            counted=counted[phase], floors=floors[phase], phase_s=phase_s,
        )  # fmt: skip
        print(
            f"  as the harness counts ({size.drain_timeout_s:.0f} s drain): TTFT p50 of the "
            "requests answered by then, ratio, ok/sent, goodput req/s, served req/s"
        )
        base = counted[phase][ways[0]]
        for way in ways:
            rows_c = counted[phase][way]
            ratios = [c.p50_ms / b.p50_ms for c, b in zip(rows_c, base, strict=True)]
            print(f"  {way:14} p50 {statistics.fmean(c.p50_ms for c in rows_c):7.1f} ms  "
                  f"ratio {statistics.fmean(ratios):.3f} [{max(ratios):.3f}]  ok "
                  f"{statistics.fmean(c.ok / c.sent for c in rows_c):.3f}  goodput "
                  f"{statistics.fmean(c.goodput_rps for c in rows_c):5.2f}  served "
                  f"{statistics.fmean(c.served_rps for c in rows_c):5.2f}")  # fmt: skip


def report(
    phase: str,
    *,
    ways: Sequence[str],
    seeds: Sequence[int],
    p50: dict[str, list[float]],
    shares: dict[str, list[float]],
    counted: dict[str, list[Counted]],
    floors: Sequence[float],
    phase_s: float,
) -> None:
    """Print one phase's figures over every request, each finished in the end."""
    base = p50[ways[0]]
    print(f"{phase}: TTFT p50 over {ways[0]}'s, mean [worst] over seeds "
          f"{','.join(map(str, seeds))}; SLO share (of the requests sent) mean [least]; "
          "goodput (in SLO / phase s)")  # fmt: skip
    for way in ways:
        ratios = [v / b for v, b in zip(p50[way], base, strict=True)]
        share = shares[way]
        good = statistics.fmean(s * c.sent for s, c in zip(share, counted[way], strict=True))
        print(f"  {way:14} p50 {statistics.fmean(p50[way]):7.1f} ms  ratio "
              f"{statistics.fmean(ratios):.3f} [{max(ratios):.3f}]  SLO "
              f"{statistics.fmean(share):.3f} [{min(share):.2f}]  goodput "
              f"{good / phase_s:5.2f}")  # fmt: skip
    ratios = [v / b for v, b in zip(floors, base, strict=True)]
    if len(seeds) > 1:
        print("  per seed, p50 over " + ways[0] + "'s: " + ", ".join(
            f"{seed}: " + "/".join(f"{p50[w][i] / base[i]:.2f}" for w in ways)
            + f"/{ratios[i]:.2f}" for i, seed in enumerate(seeds)
        ) + f" ({'/'.join(ways)}/floor)")  # fmt: skip
    print(
        f"  {'floor':14} p50 {statistics.fmean(floors):7.1f} ms  ratio "
        f"{statistics.fmean(ratios):.3f} [{max(ratios):.3f}]  (no placement beats it)"
    )


if __name__ == "__main__":
    main()
