"""The scheduler alone, on a scenario's schedule, in virtual time: no network, no noise.

``python -m bench.dispatch_sim [--scenario bench/scenarios/contention.toml] [--size full]
[--policy headroom=0.5 ...]`` plays every phase of the scenario (the same deterministic
schedule the harness sends, :func:`bench.workload.plan_phase`) through a real
:class:`~runtime.scheduling.dispatcher.PoolDispatcher` over an in-memory fleet
(:class:`~runtime.testing.fleet.HandFleet`: the scenario's backends, each with
``max_num_seqs`` slots), with a virtual clock that jumps from event to event. An engine is
modelled as the simulator worker runs it (``runtime.workers.simulator``): one step loop per
engine; a step takes in every request granted since the last one, lasts their prompts'
prefill plus one decode step at the batch size (``prompt_tokens / prefill_tps + decode_a_ms +
decode_b_ms * batch``) and gives every running request a token; a request's first token comes
at the end of the step that took it in, and it holds its slot until its ``max_tokens``-th.
Newcomers' prefill slows everyone's step, so a burst stretches the generations in flight, as
on the harness (an earlier model that charged a request only its own prefill showed a quarter
of the harness's contention tail). The router's slots equal the engines' sequences, so an
engine never holds a request for want of a slot. ``--max-batched-tokens N`` models vLLM V1's
chunked prefill instead (:mod:`bench.sim_engine`: a token budget per step, decodes first,
prefills cut to what is left; a request granted may then wait in the engine for budget, in
band order with ``--policy upstream_priority=on``).

It prints, per phase, tenant and class, the TTFT p50 / p95 in ms over the requests that got a
slot, and for each tenant that does not flood its p95 under the flood over its baseline's.
Runs take seconds and repeat exactly, so a change to a scheduling policy can be judged here
before a (noisy) harness run; the figures are the scheduler's share of the latency, not a
router's. ``--seed N`` plays another schedule of the same scenario: a rule tuned on one
schedule's bursts should hold on others. Each phase starts once the previous one has drained,
as in ``bench run``.

Prefix caches: with a scenario that shares prefixes (a ``[prefix]`` table) or ``--routing``,
each engine keeps the simulator's prefix cache
(:class:`~runtime.workers.simulator.prefix_cache.PrefixCache`, the backends' ``block_size``
and ``prefix_cache_blocks``) over the rendered chat prompt, and a step prefills only its
newcomers' uncached tokens. ``--routing load`` places by load (as today's router);
``--routing prefix`` places as the router will with the prefix index and the sticky rule
(:mod:`bench.prefix_placement`). Each phase then also prints its overall TTFT p50/p95, the
engines' hit rate and how many placements were sticky.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import heapq
import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from bench.prefix_placement import Mode, PrefixFleet
from bench.scenario import Scenario, load
from bench.sim_engine import VLLM_BUDGET, Engine, EngineOptions, Seq
from bench.sim_preempt import SimStream
from bench.sim_report import Flow, Outcome, cell, flow_table, prefix_table, table
from bench.workload import Planned, chat_messages, plan_phase
from runtime.degradation import DegradeSettings, Limits, PoolState
from runtime.gateway.tokens import TokenCount, byte_bound, prefill_estimate, text_overheads
from runtime.routing.prefix import chat_block_hashes
from runtime.routing.prefix_index import PrefixIndex
from runtime.routing.sticky import StickyRule
from runtime.scheduling.dispatcher import PoolDispatcher
from runtime.scheduling.grant import Grant, SchedulingError, Ticket
from runtime.scheduling.registry import preemption_names, preemption_policy
from runtime.scheduling.settings import PoolSettings
from runtime.testing.fleet import HandFleet
from runtime.workers.simulator.prefix_cache import (
    PrefixCache,
    PrefixCacheConfig,
    render_chat,
    text_block_hashes,
)
from runtime.workers.simulator.text import count_chat_tokens
from runtime.workers.simulator.timing import TimingModel


@dataclass(slots=True)
class _Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


def _ticket(
    scenario: Scenario, p: Planned, now: float, weight: float, key: str | None = None
) -> Ticket:
    """``p`` as the gateway makes its ticket without a tokenizer (the harness's simulator
    model has none): ``input_tokens`` the byte bound (what fairness charges), and
    ``prefill_tokens`` the characters over 4 with the chat overheads (the pacing's and the
    victim choice's estimate; the engines prefill ``p.prompt_tokens``)."""
    spec = scenario.classes[p.klass]
    messages = chat_messages(p)
    texts = [m["content"] for m in messages]
    overheads = text_overheads(texts, [m["role"] for m in messages])
    bound = TokenCount(byte_bound(texts, overheads), exact=False)
    return Ticket(
        tenant=p.tenant, version=1, input_tokens=bound.tokens, max_output_tokens=p.max_tokens,
        band=spec.priority_band, class_name=p.klass, shed_order=spec.shed_order, weight=weight,
        deadline=now + spec.deadline_ms / 1000.0, affinity_key=key,
        prefill_tokens=prefill_estimate(bound, texts, overheads),
    )  # fmt: skip


_Waiting = tuple["asyncio.Task[Grant]", Planned, float, "Seq | None"]


class _Run:
    """The engines, the event heap (arrivals and step ends) and what came out."""

    def __init__(
        self,
        scenario: Scenario,
        settings: PoolSettings,
        routing: Mode | None = None,
        rule: StickyRule | None = None,
        *,
        preempt: bool = False,
        victim: str = "fair",
        degrade: DegradeSettings | None = None,
        lend_reserve: int = 0,
        engine: EngineOptions | None = None,
    ) -> None:
        self.scenario = scenario
        options = engine or EngineOptions()
        self.degrade = degrade or DegradeSettings()
        b = scenario.backends
        self.timing = TimingModel(
            prefill_tps=b.prefill_tps, decode_a_ms=b.decode_a_ms, decode_b_ms=b.decode_b_ms
        )
        self.clock = _Clock()
        if routing is None and scenario.prefix.enabled:
            routing = "load"
        self.prefix: PrefixFleet | None = None
        fleet = HandFleet()
        if routing is not None:
            fleet = self.prefix = PrefixFleet(mode=routing, now=self.clock, rule=rule)
        cache = PrefixCacheConfig(block_size=b.block_size, capacity_blocks=b.cache_blocks())
        self.engines: dict[int, Engine] = {}
        for endpoint_id in range(1, scenario.backends.count + 1):
            fleet.add(endpoint_id, capacity=scenario.backends.max_num_seqs)
            engine_cache = PrefixCache(cache) if self.prefix is not None else None
            self.engines[endpoint_id] = Engine(
                budget=options.budget,
                max_num_seqs=b.max_num_seqs,
                cache=engine_cache,
                own=PrefixCache(cache) if options.resume_cache else None,
                priority=options.priority,
            )
        self.cache_tokens: dict[str, list[int]] = {}  # phase -> [queried, hit] tokens
        self.block_size = b.block_size
        self.rendered: dict[str, tuple[int, tuple[int, ...]]] = {}  # key -> engine's view
        self.placements: dict[str, tuple[int, int]] = {}  # phase -> (sticky, by load)
        if preempt and self.prefix is not None:
            raise ValueError("preemption is not modelled with prefix caches")
        self.preempt = preempt  # the dispatcher takes lent slots back (bench.sim_preempt)
        if preempt:
            preemption_policy(victim)  # (an unknown name fails here)
            settings = dataclasses.replace(settings, preemption=victim)
        self.waiting: dict[int, _Waiting] = {}  # the phase's requests waiting for a grant
        self.dispatcher = PoolDispatcher(
            "p", settings, fleet, clock=self.clock, tick_s=3600.0, lend=preempt,
            lend_reserve=lend_reserve,
        )  # fmt: skip
        self.paced = preempt and settings.pace_prefill_tps > 0
        self.free_resume = options.free_resume  # an oracle (bench.sim_preempt)
        self.resume_hits: dict[str, list[int]] = {}  # phase -> [resumes, cached tokens]
        self.phase_s = float("inf")  # tokens count as "under the phase" up to this long
        self.flow: dict[str, Flow] = {}  # phase -> output tokens, preemptions, re-prefill
        self.weights = {t.name: t.weight for t in scenario.tenants}
        self.order = itertools.count()
        self.events: list[tuple[float, int, Planned | int]] = []  # arrivals, step ends
        self.outcomes: list[Outcome] = []

    def step(self, endpoint_id: int) -> None:
        """Start the engine's next step, if it has anything to run."""
        engine = self.engines[endpoint_id]
        duration = engine.schedule(self.timing)
        engine.stepping = duration is not None
        if duration is not None:
            heapq.heappush(self.events, (self.clock.now + duration, next(self.order), endpoint_id))

    def step_ended(self, endpoint_id: int, phase: str) -> None:
        engine = self.engines[endpoint_id]
        flow = self.flow.setdefault(phase, Flow())
        in_window = self.clock.now - flow.start <= self.phase_s
        for seq in engine.finish():
            if seq not in engine.running:  # preempted by a release earlier in this loop
                continue
            if seq.paused_at is not None:  # its first token since it was preempted
                one_prefill = self.timing.prefill_seconds(seq.prefill or 0)
                pause, engine_part = self.clock.now - seq.paused_at, self.clock.now - seq.resumed_at
                flow.pauses.append((pause, one_prefill, engine_part))
                seq.paused_at = None
                hits = self.resume_hits.setdefault(phase, [0, 0])
                hits[0] += seq.cached > 0
                hits[1] += seq.cached
            seq.prefill = None
            seq.generated += 1
            seq.grant.charged_output = seq.generated  # what the victim policy reads
            flow.tokens += 1
            flow.window_tokens += in_window
            if not seq.started:
                seq.started = True
                ttft = self.clock.now - seq.arrived
                self.outcomes.append(Outcome(phase, seq.planned.tenant, seq.planned.klass, ttft))
                if self.prefix is not None:
                    self.prefix.started(endpoint_id, str(seq.planned.index))
                    counts = self.cache_tokens.setdefault(phase, [0, 0])
                    counts[0] += seq.prompt_tokens
                    counts[1] += seq.cached
            seq.left -= 1
            if seq.left <= 0:
                engine.freed(seq, seq.context())
                engine.running.remove(seq)
                seq.grant.release()
        self.step(endpoint_id)

    async def phase(self, phase: str, requests: Sequence[Planned]) -> None:
        """Play one phase's requests until every one has finished or failed."""
        loop = asyncio.get_running_loop()
        start = self.clock.now
        for p in requests:
            heapq.heappush(self.events, (start + p.at, next(self.order), p))
        waiting: dict[int, _Waiting] = {}
        self.waiting = waiting
        self.flow[phase] = Flow(start=start)
        try:
            await self._play(phase, loop, waiting)
        finally:
            if self.prefix is not None:
                self.placements[phase] = (self.prefix.sticky, self.prefix.by_load)

    async def _play(
        self,
        phase: str,
        loop: asyncio.AbstractEventLoop,
        waiting: dict[int, _Waiting],
    ) -> None:
        while self.events:
            at, key, item = heapq.heappop(self.events)
            self.clock.now = at
            if isinstance(item, Planned):
                self.arrive(phase, item, key, waiting)
            elif item:
                self.step_ended(item, phase)
            if self.paced:  # a paced lent slot may go now; else wake when the next may
                self.wake(self.dispatcher.poke(), waiting)
            await self._settle(phase, waiting)

    def arrive(self, phase: str, item: Planned, key: int, waiting: dict[int, _Waiting]) -> None:
        """A request arrives now: it asks the dispatcher for a slot."""
        item = self.degraded(phase, item)
        affinity = self.expect(item)
        at = self.clock.now
        ticket = _ticket(self.scenario, item, at, self.weights[item.tenant], affinity)
        task = asyncio.get_running_loop().create_task(self.dispatcher.acquire(ticket))
        waiting[key] = (task, item, at, None)

    def wake(self, at: float | None, waiting: dict[int, _Waiting]) -> None:
        """An event (endpoint 0: none) at ``at``, unless one is due by then anyway."""
        if at is None or not waiting or (self.events and self.events[0][0] <= at):
            return
        heapq.heappush(self.events, (at, next(self.order), 0))

    async def _settle(self, phase: str, waiting: dict[int, _Waiting]) -> None:
        for _ in range(4):  # let the woken acquire() calls return
            await asyncio.sleep(0)
        for wait_key, (task, p, arrived, paused) in list(waiting.items()):
            if task.done():
                del waiting[wait_key]
                self.granted(task, p, arrived, phase, paused)

    def reset_caches(self) -> None:
        for engine in self.engines.values():
            if engine.cache is not None:
                engine.cache.reset()
            if engine.own is not None:
                engine.own.reset()
        if self.prefix is not None:
            self.prefix.index = PrefixIndex(
                max_blocks_per_endpoint=self.prefix.index.max_blocks_per_endpoint,
                ttl_seconds=self.prefix.index.ttl_seconds,
            )
            self.prefix.sticky = self.prefix.by_load = 0

    def degraded(self, phase: str, p: Planned) -> Planned:
        """The request as the ``degrade`` stage sends it: the pool's policy for its class,
        decided on the dispatcher's measured queue wait (one pool: no fallback to model)."""
        spec = self.scenario.classes[p.klass]
        policy = self.degrade.policy_for(p.klass)
        if policy.name == "off":
            return p
        state = PoolState(queue_wait_s=self.dispatcher.queue_wait_s(spec.priority_band))
        limits = Limits(
            wait_s=self.degrade.wait_s(spec.ttft_slo_ms), max_tokens=self.degrade.max_tokens,
            asked_tokens=p.max_tokens, has_fallback=False,
        )  # fmt: skip
        decision = policy.decide(state, limits)
        if decision is None or not decision.max_tokens:
            return p
        flow = self.flow[phase]
        flow.capped += 1
        flow.tokens_capped += p.max_tokens - decision.max_tokens
        return dataclasses.replace(p, max_tokens=decision.max_tokens)

    def expect(self, p: Planned) -> str | None:
        """With prefix caches: tell the placement the request's router-side blocks."""
        if self.prefix is None:
            return None
        pairs = [(m["role"], m["content"]) for m in chat_messages(p)]
        key = str(p.index)
        tokens = count_chat_tokens([content for _, content in pairs])
        self.prefix.expect(key, chat_block_hashes(pairs), tokens)
        self.rendered[key] = (tokens, text_block_hashes(render_chat(pairs), self.block_size))
        return key

    def offer(self, seq: Seq, phase: str) -> None:
        """With preemption: offer the generation to the dispatcher's take-back."""
        if self.preempt:
            flow = self.flow.setdefault(phase, Flow())
            seq.grant.preemptible(SimStream(self, seq, flow, self.waiting))

    def granted(
        self,
        task: asyncio.Task[Grant],
        p: Planned,
        arrived: float,
        phase: str,
        paused: Seq | None = None,
    ) -> None:
        if isinstance(task.exception(), SchedulingError):
            if paused is not None:  # a preempted generation could not resume: it ends
                paused.grant.release()
            if paused is None or not paused.started:
                self.outcomes.append(Outcome(phase, p.tenant, p.klass, None))
            return
        grant = task.result()
        endpoint_id = grant.endpoint.id if grant.endpoint is not None else 1
        if paused is not None:  # a preempted generation resumes (its prefill is set)
            paused.grant, paused.started_at = grant, self.clock.now
            paused.resumed_at = self.clock.now
            self.offer(paused, phase)
            self.engines[endpoint_id].waiting.append(paused)
            if not self.engines[endpoint_id].stepping:
                self.step(endpoint_id)
            return
        seq = Seq(grant, p, arrived, max(p.max_tokens, 1), key=next(self.order))
        seq.deadline, seq.started_at = grant.ticket.deadline, self.clock.now
        if self.prefix is not None:
            seq.prompt_tokens, seq.block_hashes = self.rendered.pop(str(p.index))
        seq.band = grant.ticket.band
        self.offer(seq, phase)
        self.engines[endpoint_id].waiting.append(seq)
        if not self.engines[endpoint_id].stepping:
            self.step(endpoint_id)


async def simulate(
    scenario: Scenario, settings: PoolSettings, *, phase_s: float, max_requests: int = 100_000
) -> list[Outcome]:
    """Every request of every phase, in virtual time; see the module docstring."""
    run = await simulate_run(scenario, settings, phase_s=phase_s, max_requests=max_requests)
    return run.outcomes


async def simulate_run(
    scenario: Scenario,
    settings: PoolSettings,
    *,
    phase_s: float,
    max_requests: int = 100_000,
    routing: Mode | None = None,
    rule: StickyRule | None = None,
    preempt: bool = False,
    victim: str = "fair",
    degrade: DegradeSettings | None = None,
    lend_reserve: int = 0,
    engine: EngineOptions | None = None,
) -> _Run:
    """:func:`simulate`, returning the whole run (its prefix-cache figures too); ``preempt``:
    the flood limit lends idle slots and takes them back by preemption (module docstring);
    ``degrade``: the pool's degradation (``cap_tokens`` is modelled); ``lend_reserve``: with
    ``preempt``, the free slots the flood limit does not lend (the dispatcher's); ``engine``:
    how the engines schedule (:class:`~bench.sim_engine.EngineOptions`; default whole
    prefills, FCFS)."""
    run = _Run(scenario, settings, routing, rule, preempt=preempt, victim=victim,
               degrade=degrade, lend_reserve=lend_reserve, engine=engine)  # fmt: skip
    await play(run, phase_s=phase_s, max_requests=max_requests)
    return run


async def play(run: _Run, *, phase_s: float, max_requests: int = 100_000) -> None:
    """Play every phase of ``run``'s scenario through it, each once the previous one has
    drained (as in ``bench run``)."""
    run.phase_s = phase_s
    run.dispatcher.start()
    try:
        for phase in run.scenario.phases:
            plan = plan_phase(run.scenario, phase, duration_s=phase_s, max_requests=max_requests)
            run.reset_caches()  # as `bench run` does before every measured phase
            await run.phase(phase.name, plan.requests)
    finally:
        await run.dispatcher.stop()


def _sticky_rule(parser: argparse.ArgumentParser, items: Sequence[str]) -> StickyRule:
    values: dict[str, float] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or key.strip() not in StickyRule.__dataclass_fields__:
            parser.error(f"--sticky wants KEY=VALUE with a StickyRule field, got {item!r}")
        try:
            values[key.strip()] = float(value)
        except ValueError:
            parser.error(f"--sticky {item!r}: not a number")
    ints = {"min_saved_tokens", "slack_tokens"}
    try:
        return StickyRule(**{k: int(v) if k in ints else v for k, v in values.items()})  # type: ignore[arg-type]
    except ValueError as exc:
        parser.error(str(exc))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.dispatch_sim")
    parser.add_argument("--scenario", type=Path, default=Path("bench/scenarios/contention.toml"))
    parser.add_argument("--size", default="full", help="whose phase_duration_s to use")
    parser.add_argument(
        "--policy", action="append", default=[], metavar="KEY=VALUE",
        help="a pool policy (as in PoolSnap.policies), e.g. headroom=0.5",
    )  # fmt: skip
    parser.add_argument(
        "--seed", type=int, default=None, help="another schedule than the scenario's seed gives"
    )
    parser.add_argument(
        "--sticky", action="append", default=[], metavar="KEY=VALUE",
        help="a parameter of the sticky rule (runtime.routing.sticky.StickyRule), e.g. "
        "stickiness=2",
    )  # fmt: skip
    parser.add_argument(
        "--routing", choices=("load", "prefix"), default=None,
        help="with prefix caches in the engines: place by load or by the prefix index and "
        "the sticky rule (default: load when the scenario shares prefixes, else none)",
    )  # fmt: skip
    parser.add_argument(
        "--preempt", choices=("off", "on"), default="off",
        help="on: the flood limit lends idle slots and takes them back by preemption; a "
        "resumed generation prefills its prompt plus what it generated",
    )  # fmt: skip
    parser.add_argument(
        "--flood-load", type=float, default=None, metavar="X",
        help="the flood phase's total load, x capacity (the scenario's flood_load_factor)",
    )  # fmt: skip
    parser.add_argument(
        "--victim", choices=[n for n in preemption_names() if n != "off"], default="fair",
        help="with --preempt on: the victim choice (runtime.scheduling.preempt)",
    )  # fmt: skip
    parser.add_argument(
        "--lend-reserve", type=int, default=0, metavar="N",
        help="with --preempt on: lend only while more than N of the pool's slots are free",
    )  # fmt: skip
    parser.add_argument(
        "--max-batched-tokens", type=int, default=0, metavar="N",
        help="the engines' chunked prefill: vLLM's max_num_batched_tokens per step (its V1 "
        f"default {VLLM_BUDGET}); 0: whole prefills, as the simulator worker (default)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.max_batched_tokens < 0:
        parser.error("--max-batched-tokens must be >= 0")
    if args.lend_reserve < 0:
        parser.error("--lend-reserve must be >= 0")
    if args.preempt == "on" and args.routing is not None:
        parser.error("--preempt on is not modelled with --routing (prefix caches)")
    scenario = load(args.scenario)
    if args.seed is not None:
        scenario = dataclasses.replace(scenario, seed=args.seed)
    if args.flood_load is not None:
        phases = tuple(
            dataclasses.replace(ph, flood_load_factor=args.flood_load)
            if ph.flood_load_factor is not None else ph
            for ph in scenario.phases
        )  # fmt: skip
        scenario = dataclasses.replace(scenario, phases=phases)
    policies = dict(scenario.switchyard.policies)
    for item in args.policy:
        key, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--policy wants KEY=VALUE, got {item!r}")
        policies[key.strip()] = value.strip()
    settings = PoolSettings.from_policies(policies, ())
    degrade = DegradeSettings.from_policies(policies)  # the `degrade*` policies
    phase_s = scenario.size(args.size).phase_duration_s
    rule = _sticky_rule(parser, args.sticky)
    engine = EngineOptions(budget=args.max_batched_tokens or None,
                           priority=policies.get("upstream_priority") == "on")  # fmt: skip
    run = asyncio.run(
        simulate_run(scenario, settings, phase_s=phase_s, routing=args.routing, rule=rule,
                     preempt=args.preempt == "on", victim=args.victim, degrade=degrade,
                     lend_reserve=args.lend_reserve, engine=engine)
    )  # fmt: skip
    print(f"{scenario.name}, {args.size} ({phase_s:g} s phases), policies {policies or 'default'}"
          + (f", routing {args.routing}" if args.routing else "")
          + (f", preempt on ({args.victim}, lend reserve {args.lend_reserve})"
             if args.preempt == "on" else "")
          + (f", chunked prefill {engine.budget}" if engine.budget else ""))  # fmt: skip
    rows = table(scenario, run.outcomes)
    if run.prefix is not None:
        rows.update(prefix_table(run))
    rows.update(flow_table(run))
    for key, row in rows.items():
        cells = "  ".join(f"{name}={cell(name, value)}" for name, value in row.items())
        print(f"{key:34} {cells}")


if __name__ == "__main__":
    main()
