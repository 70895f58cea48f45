"""Preemption in the simulator (:mod:`bench.dispatch_sim`): the router's own take-back.

With ``--preempt on`` the pool's ``preemption`` policy is set, so the dispatcher
(:class:`~runtime.scheduling.dispatcher.PoolDispatcher`) lends idle slots and takes them back
itself, as in the router (:mod:`runtime.scheduling.takeback`: the victim policy among the
offered streams of the tenants holding lent slots, at most
:data:`~runtime.scheduling.takeback.MAX_PREEMPTIONS` times per stream; a resume waits parked
in the queue with its place and deadline). Each generation offers itself when it is
granted (:class:`SimStream`, the :class:`~runtime.scheduling.grant.Preemptee` the gateway's
migrating stream is in the router; every simulated request is treated as a stream). When the
dispatcher stops it, it leaves its engine at once, keeps its tokens so far and waits for
:meth:`~runtime.scheduling.grant.Grant.resumed`; when it gets a slot again its first step
prefills its prompt plus what it generated (the resume cost, counted in full: the resumed
generation's ``prefill``; with the oracle ``EngineOptions.free_resume`` only what it had
not prefilled yet; with ``EngineOptions.resume_cache`` the engine it resumes on prefills
what its prefix cache does not hold, :mod:`bench.sim_engine`). The pause, from its
preemption to its next token, is recorded against one prefill of that context
(``Flow.pauses``).

The grant's ``charged_output`` (what the victim policy reads as generated) is set to the
tokens generated without charging the fairness counters: the simulator charges no output
tokens in any arm, so the arms stay comparable.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from bench.sim_report import Flow

if TYPE_CHECKING:
    from bench.dispatch_sim import _Run, _Waiting
    from bench.sim_engine import Seq
    from runtime.scheduling.grant import Grant


async def _resumed(grant: Grant) -> Grant:
    await grant.resumed()
    return grant


class SimStream:
    """One simulated generation as the dispatcher's take-back sees it (module docstring)."""

    __slots__ = ("_flow", "_run", "_seq", "_waiting")

    def __init__(self, run: _Run, seq: Seq, flow: Flow, waiting: dict[int, _Waiting]) -> None:
        self._run, self._seq, self._flow, self._waiting = run, seq, flow, waiting

    def preemptible(self) -> bool:
        """On an engine, with tokens left (the dispatcher withdraws it when it ends)."""
        seq = self._seq
        return seq.left > 0 and any(seq in e.running or seq in e.waiting
                                    for e in self._run.engines.values())  # fmt: skip

    def preempt(self) -> None:
        """Leave the engine now and wait, parked, for a slot again."""
        run, seq = self._run, self._seq
        tokens = seq.planned.prompt_tokens + seq.generated
        for engine in run.engines.values():
            if seq in engine.running or seq in engine.waiting:
                engine.freed(seq, engine.computed(seq))  # its blocks stay cached there
                if run.free_resume:  # the oracle: only what it had not prefilled yet
                    tokens = max(seq.todo, 0) if seq in engine.running else _need(seq)
                engine.remove(seq)
        resumes(self._flow, seq, tokens)
        seq.paused_at = run.clock.now
        task = asyncio.get_running_loop().create_task(_resumed(seq.grant))
        self._waiting[next(run.order)] = (task, seq.planned, seq.arrived, seq)


def _need(seq: Seq) -> int:
    """What ``seq`` prefills when next scheduled (it has not been since its grant)."""
    return seq.planned.prompt_tokens if seq.prefill is None else seq.prefill


def resumes(flow: Flow, seq: Seq, tokens: int) -> None:
    """The resume accounting: ``seq``'s next admission prefills ``tokens`` (its prompt plus
    what it generated); the phase counts the preemption, the re-prefilled tokens and whether
    the generation had been preempted before."""
    seq.prefill = tokens
    flow.preemptions += 1
    flow.repeated += seq.preempted > 0
    flow.reprefilled += tokens
    seq.preempted += 1
