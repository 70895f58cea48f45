"""Why prefix-aware routing gains what it gains on a scenario, in virtual time (issue #35).

``python -m bench.prefix_diagnose [--scenario bench/scenarios/prefix.toml] [--size medium]``
plays every phase of the scenario through :mod:`bench.dispatch_sim` (the router's own
:class:`~runtime.routing.prefix_placer.PrefixPlacer`, the scheduler, engines with the
simulator's prefix cache) in five ways, and prints per phase the engines' prefix-cache hit
rate, the TTFT p50 and the share within the TTFT SLO of each:

- ``load``: load-only routing;
- ``prefix``: prefix-aware routing as the router does it;
- ``bytes``: the same with the router's token estimate before the fix, the plan's upper
  bound of one token a byte (4x the tokens of this scenario's text) as the request's prompt
  tokens, so its uncached prefill looks 4x longer than the prefix it saves;
- ``never-leave``: the sticky rule with ``stickiness = inf`` (a request leaves its cached
  endpoint only when that one's batch is full): what the placement could gain at most by
  sticking more;

and ``replay``, no timing (:func:`replay`): each phase's requests in arrival order, every
conversation kept on one engine (the least used when it starts), unique requests round robin,
a system prompt prefilled once per engine: the hit rate of "a conversation always on one
engine, system prompts replicated", to compare with what the placer reaches. Last, per phase,
the median uncached prompt tokens per request by kind (unique, a conversation's first turn, a
later turn), round robin against pinned: what any placement can save at most.

``--seeds 35,1,2`` instead plays the scenario's schedule drawn from each seed (one knee is one
schedule's bursts: a rule tuned on one should hold on others) with load-only routing,
prefix-aware routing, the same without the prefix hold (``hold_ms = 0``) and, if given, with
``--policy KEY=VALUE`` (the sticky rule's pool policies, e.g. ``prefix_hold_ms=500``), and
prints per phase the share within the TTFT SLO (mean and least over the seeds), then per seed
that share at ``--phase`` (default ``load-24``, load-only's knee) and its goodput over
load-only's.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from bench.dispatch_sim import simulate_run
from bench.prefix_placement import PrefixFleet
from bench.scenario import Scenario, load
from bench.sim_report import prefix_table
from bench.workload import PhasePlan, chat_messages, plan_phase
from runtime.routing.sticky import StickyRule
from runtime.scheduling.settings import PoolSettings
from runtime.workers.simulator.prefix_cache import (
    PrefixCache,
    PrefixCacheConfig,
    render_chat,
    text_block_hashes,
)

BYTES_PER_TOKEN = 4  # the scenario's text: 4 one-byte characters a token


@contextmanager
def byte_bound_tokens() -> Iterator[None]:
    """While inside, the placer is told each prompt's bytes as its tokens (the old estimate)."""
    original: Callable[[PrefixFleet, str, tuple[int, ...], int], None] = PrefixFleet.expect

    def expect(self: PrefixFleet, key: str, hashes: tuple[int, ...], prompt_tokens: int) -> None:
        original(self, key, hashes, prompt_tokens * BYTES_PER_TOKEN)

    PrefixFleet.expect = expect  # type: ignore[method-assign]
    try:
        yield
    finally:
        PrefixFleet.expect = original  # type: ignore[method-assign, assignment]


def replay(scenario: Scenario, plan: PhasePlan, *, pinned: bool) -> Replayed:
    """One phase's requests in arrival order, no timing: with ``pinned`` every conversation
    stays on one engine (the least used when it starts), else round robin; unique requests
    go round robin either way."""
    backends = scenario.backends
    config = PrefixCacheConfig(
        block_size=backends.block_size, capacity_blocks=backends.cache_blocks()
    )
    caches = [PrefixCache(config) for _ in range(backends.count)]
    turn = itertools.cycle(range(backends.count))
    home: dict[str, int] = {}
    started = [0] * backends.count
    out = Replayed()
    for planned in plan.requests:
        if pinned and planned.conversation:
            if planned.conversation not in home:
                engine = min(range(backends.count), key=started.__getitem__)
                home[planned.conversation] = engine
                started[engine] += 1
            engine = home[planned.conversation]
        else:
            engine = next(turn)
        rendered = render_chat([(m["role"], m["content"]) for m in chat_messages(planned)])
        tokens = len(rendered) // 4
        hit = caches[engine].admit(text_block_hashes(rendered, backends.block_size), tokens)
        out.queried += tokens
        out.hit += hit
        kind = "first" if not planned.history else "later"
        out.uncached[kind if planned.conversation else "unique"].append(tokens - hit)
    return out


@dataclass
class Replayed:
    queried: int = 0
    hit: int = 0
    uncached: dict[str, list[int]] = field(
        default_factory=lambda: {"unique": [], "first": [], "later": []}
    )

    @property
    def hit_rate(self) -> float:
        return self.hit / self.queried if self.queried else 0.0

    def medians(self) -> str:
        every = [u for tokens in self.uncached.values() for u in tokens]
        parts = [f"all {statistics.median(every):g}"] + [
            f"{kind} ({len(tokens)}) {statistics.median(tokens):g}"
            for kind, tokens in self.uncached.items()
            if tokens
        ]
        return ", ".join(parts)


def replay_hit_rates(scenario: Scenario, phase_s: float) -> dict[str, float]:
    """Per phase, the hit rate with every conversation pinned to one engine."""
    return {
        phase.name: replay(
            scenario, plan_phase(scenario, phase, duration_s=phase_s, max_requests=100_000),
            pinned=True,
        ).hit_rate
        for phase in scenario.phases
    }  # fmt: skip


def slo_shares(
    scenario: Scenario, settings: PoolSettings, phase_s: float, routing: str,
    rule: StickyRule | None,
) -> dict[str, float]:  # fmt: skip
    """Per phase, the share of requests within their TTFT SLO, in virtual time."""
    run = asyncio.run(
        simulate_run(scenario, settings, phase_s=phase_s, routing=routing, rule=rule)  # type: ignore[arg-type]
    )
    return {key.split()[0]: row["slo_share"] or 0.0 for key, row in prefix_table(run).items()}


def seed_table(
    scenario: Scenario, settings: PoolSettings, phase_s: float, *, seeds: list[int], knee: str,
    extra: StickyRule | None,
) -> None:  # fmt: skip
    """Print the SLO shares of load-only, prefix-aware, no hold (and ``extra``) per seed."""
    ways: dict[str, tuple[str, StickyRule | None]] = {
        "load": ("load", None), "prefix": ("prefix", StickyRule()),
        "no-hold": ("prefix", StickyRule(hold_ms=0.0)),
    }  # fmt: skip
    if extra is not None:
        ways["--policy"] = ("prefix", extra)
    shares = {
        name: [
            slo_shares(dataclasses.replace(scenario, seed=seed), settings, phase_s, *how)
            for seed in seeds
        ]
        for name, how in ways.items()
    }
    print(f"{scenario.name} ({phase_s:g} s phases), seeds {','.join(map(str, seeds))}: "
          "share within the TTFT SLO, mean [least]")  # fmt: skip
    print(f"{'phase':8} " + "  ".join(f"{name:>14}" for name in ways))
    for phase in scenario.phases:
        cells = [[run[phase.name] for run in runs] for runs in shares.values()]
        print(f"{phase.name:8} " + "  ".join(
            f"{statistics.mean(c):.3f} [{min(c):.2f}]".rjust(14) for c in cells
        ))  # fmt: skip
    print(f"at {knee}, per seed: share (goodput / load-only's)")
    for i, seed in enumerate(seeds):
        base = shares["load"][i][knee]
        print(f"seed {seed:<4} " + "  ".join(
            f"{runs[i][knee]:.2f} ({runs[i][knee] / base if base else 0:.2f}x)".rjust(14)
            for runs in shares.values()
        ))  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.prefix_diagnose")
    parser.add_argument("--scenario", type=Path, default=Path("bench/scenarios/prefix.toml"))
    parser.add_argument("--size", default="medium", help="whose phase_duration_s to use")
    parser.add_argument("--seeds", default="", help="comma-separated: the per-seed table")
    parser.add_argument("--phase", default="load-24", help="with --seeds: the knee's phase")
    parser.add_argument(
        "--policy", action="append", default=[], metavar="KEY=VALUE",
        help="with --seeds: a sticky rule's pool policy (prefix_hold_ms=500) for a 4th column",
    )  # fmt: skip
    args = parser.parse_args(argv)
    scenario = load(args.scenario)
    phase_s = scenario.size(args.size).phase_duration_s
    settings = PoolSettings.from_policies(dict(scenario.switchyard.policies), ())
    if args.seeds:
        policies = dict(item.partition("=")[::2] for item in args.policy)
        try:
            extra = StickyRule.from_policies(policies, strict=True) if policies else None
        except ValueError as exc:
            parser.error(str(exc))
        seeds = [int(s) for s in args.seeds.split(",")]
        seed_table(scenario, settings, phase_s, seeds=seeds, knee=args.phase, extra=extra)
        return
    ways: dict[str, dict[str, dict[str, float | None]]] = {}
    for name, routing, rule in (
        ("load", "load", None),
        ("prefix", "prefix", None),
        ("bytes", "prefix", None),
        ("never-leave", "prefix", StickyRule(stickiness=float("inf"))),
    ):
        play = simulate_run(scenario, settings, phase_s=phase_s, routing=routing, rule=rule)  # type: ignore[arg-type]
        if name == "bytes":
            with byte_bound_tokens():
                run = asyncio.run(play)
        else:
            run = asyncio.run(play)
        ways[name] = {key.split()[0]: row for key, row in prefix_table(run).items()}
    pinned_rates = replay_hit_rates(scenario, phase_s)
    print(
        f"{scenario.name}, {args.size} ({phase_s:g} s phases): hit rate / TTFT p50 ms / SLO share"
    )
    print(f"{'phase':8} {'replay':>7}  " + "  ".join(f"{n:>22}" for n in ways))
    for phase in scenario.phases:
        cells = []
        for rows in ways.values():
            row = rows[phase.name]
            hit, p50, slo = row["hit_rate"] or 0, row["p50_ms"] or 0, row["slo_share"] or 0
            cells.append(f"{hit:.2f} / {p50:6.0f} / {slo:.2f}")
        print(
            f"{phase.name:8} {pinned_rates[phase.name]:7.2f}  "
            + "  ".join(f"{c:>22}" for c in cells)
        )
    print("uncached prompt tokens per request, median by kind (replay, no timing):")
    for phase in scenario.phases:
        plan = plan_phase(scenario, phase, duration_s=phase_s, max_requests=100_000)
        for pinned in (False, True):
            how = "pinned" if pinned else "round robin"
            print(f"{phase.name:8} {how:12} {replay(scenario, plan, pinned=pinned).medians()}")


if __name__ == "__main__":
    main()
