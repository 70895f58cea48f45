"""Preemption in the simulator (:mod:`bench.dispatch_sim`): the flood limit lends idle slots
and takes them back by stopping a running generation.

:class:`TakeBack` runs after every event: for each request still waiting (no free slot took
it) whose tenant the headroom gate lets through, it stops a generation the victim policy
(:mod:`runtime.scheduling.preempt`) chooses among the tenants holding slots lent to them.
The victim keeps its tokens so far, gives its slot to the waiting request and re-queues with
its ticket's deadline; when it gets a slot again its first step prefills its prompt plus
what it generated (the resume cost, counted in full: the resumed generation's ``prefill``).
The pause, from its preemption to its next token, is recorded against one prefill of that
context (``Flow.pauses``).
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import Counter
from typing import TYPE_CHECKING

from bench.sim_report import Flow
from runtime.scheduling.preempt import Running, VictimPolicy, standing

if TYPE_CHECKING:
    from bench.dispatch_sim import _Run, _Waiting
    from bench.sim_engine import Seq



class TakeBack:
    """Takes lent slots back by preemption, the victims chosen by ``victims``."""

    def __init__(self, victims: VictimPolicy) -> None:
        self.victims = victims

    def __call__(
        self,
        run: _Run,
        phase: str,
        loop: asyncio.AbstractEventLoop,
        waiting: dict[int, _Waiting],
    ) -> bool:
        """Preempt for the requests still waiting (module docstring); whether any was."""
        arriving = [p.tenant for task, p, _, paused in waiting.values()
                    if paused is None and not task.done()]  # fmt: skip
        if not arriving:
            return False
        gate = run.dispatcher.held_back()
        if not gate:
            return False
        held = Counter(run.dispatcher.inflight())
        shares = run.dispatcher.shares()
        by_key: dict[str, tuple[int, Seq]] = {}
        running: list[Running] = []
        for endpoint_id, engine in run.engines.items():
            for seq in engine.running + engine.waiting:
                key = f"{seq.planned.index}"
                by_key[key] = (endpoint_id, seq)
                running.append(Running(
                    key, seq.planned.tenant, seq.grant.ticket.band, seq.generated,
                    seq.planned.prompt_tokens, seq.started_at,
                ))  # fmt: skip
        flow = run.flow.setdefault(phase, Flow())
        preempted = False
        for tenant in arriving:
            victim = self.victims.victim(tenant, running, standing(gate, held, shares, tenant))
            if victim is None:
                continue
            running.remove(victim)
            endpoint_id, seq = by_key[victim.key]
            run.engines[endpoint_id].remove(seq)
            held[victim.tenant] -= 1
            held[tenant] += 1
            seq.grant.release()
            self.resumes(flow, seq, victim.resume_tokens)
            seq.paused_at = run.clock.now
            ticket = dataclasses.replace(
                seq.grant.ticket, input_tokens=victim.resume_tokens, max_output_tokens=seq.left,
                deadline=seq.deadline,
            )  # fmt: skip
            task = loop.create_task(run.dispatcher.acquire(ticket))
            waiting[next(run.order)] = (task, seq.planned, seq.arrived, seq)
            preempted = True
        return preempted

    @staticmethod
    def resumes(flow: Flow, seq: Seq, tokens: int) -> None:
        """The resume accounting: ``seq``'s next admission prefills ``tokens`` (its prompt
        plus what it generated); the phase counts the preemption, the re-prefilled tokens
        and whether the generation had been preempted before."""
        seq.prefill = tokens
        flow.preemptions += 1
        flow.repeated += seq.preempted > 0
        flow.reprefilled += tokens
        seq.preempted += 1
