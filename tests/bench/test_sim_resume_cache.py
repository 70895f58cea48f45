"""bench.sim_engine's prefix caching over each sequence's own tokens (``resume_cache``) and
the resume affinity in the simulated pool (issue #34)."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest

from bench.dispatch_sim import simulate_run
from bench.scenario import load
from bench.sim_engine import Engine, EngineOptions, Seq
from bench.workload import Planned
from runtime.scheduling.settings import PoolSettings
from runtime.workers.simulator.prefix_cache import (
    PrefixCache,
    PrefixCacheConfig,
    sequence_block_hashes,
)

pytestmark = pytest.mark.unit

CONTENTION = Path(__file__).resolve().parents[2] / "bench" / "scenarios" / "contention.toml"


def _seq(key: int, *, prompt_tokens: int = 500) -> Seq:
    planned = Planned(index=key, at=0.0, tenant="t", klass="interactive",
                      prompt_tokens=prompt_tokens, max_tokens=400, stream=True)  # fmt: skip
    return Seq(grant=None, planned=planned, arrived=0.0, left=400, key=key)  # type: ignore[arg-type]


def _engine(capacity_blocks: int = 4096) -> Engine:
    return Engine(own=PrefixCache(PrefixCacheConfig(block_size=16,
                                                    capacity_blocks=capacity_blocks)))  # fmt: skip


def test_a_sequences_blocks_are_its_own_and_chain() -> None:
    assert sequence_block_hashes(1, 47, 16) == sequence_block_hashes(1, 32, 16)  # full only
    assert len(sequence_block_hashes(1, 48, 16)) == 3
    assert sequence_block_hashes(1, 48, 16)[:2] == sequence_block_hashes(1, 32, 16)
    assert not set(sequence_block_hashes(1, 48, 16)) & set(sequence_block_hashes(2, 48, 16))


def test_a_resume_prefills_only_what_its_engine_still_holds_of_it() -> None:
    home, elsewhere = _engine(), _engine()
    seq = _seq(1)
    seq.generated, seq.todo = 100, 0  # it decoded 100 tokens after its 500-token prompt
    home.running.append(seq)
    assert home.computed(seq) == 600
    home.freed(seq, home.computed(seq))  # preempted: its 37 full blocks stay cached
    home.running.remove(seq)
    seq.prefill = seq.context()  # the resume: prompt + generated
    assert home._need(seq) == 600 - 592  # the last, partial block (and nothing more)
    assert seq.cached == 592
    assert elsewhere._need(seq) == 600  # a cold engine: all of it
    evicting = _engine(capacity_blocks=10)
    evicting.freed(seq, 600)  # LRU: the chain's tail evicted first, its root kept
    assert evicting._need(seq) == 600 - 160
    waiting = _seq(2)
    home.waiting.append(waiting)
    assert home.computed(waiting) == 0  # never scheduled: nothing computed on this engine


def test_with_affinity_the_resumes_hit_their_engines_cache_and_re_prefill_less() -> None:
    # 10-s phases: 5-s ones preempted 3 streams, and whether 1 or 2 of 3 resumes placed as
    # any request land home was a coin flip (it flipped when the tickets became the
    # gateway's, byte bound and prefill estimate)
    scenario = dataclasses.replace(load(CONTENTION), seed=1)
    paced = {"pace_prefill_tps": "2500", "resume_first": "on"}
    runs = {}
    for name, policies in (("cache", paced), ("home", {**paced, "resume_affinity": "on"})):
        runs[name] = asyncio.run(simulate_run(
            scenario, PoolSettings.from_policies(policies, ()), phase_s=10.0, preempt=True,
            lend_reserve=3, engine=EngineOptions(budget=2048, resume_cache=True),
        ))  # fmt: skip
    flows = {name: run.flow["flood"] for name, run in runs.items()}
    hits = {name: run.resume_hits["flood"] for name, run in runs.items()}
    assert flows["home"].tokens == flows["cache"].tokens  # every token once either way
    assert flows["home"].preemptions > 0
    resumed, cached = hits["home"]
    assert resumed > 0
    assert cached / flows["home"].reprefilled > 0.5  # most of what resumes re-send is cached
    assert cached > hits["cache"][1]  # placed as any request, fewer resumes find their blocks
    plain = asyncio.run(simulate_run(scenario, PoolSettings.from_policies(paced, ()),
                                     phase_s=10.0, preempt=True, lend_reserve=3,
                                     engine=EngineOptions(budget=2048)))  # fmt: skip
    assert plain.resume_hits.get("flood", [0, 0])[1] == 0  # engines without the cache
