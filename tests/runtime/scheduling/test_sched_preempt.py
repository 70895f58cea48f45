"""Victim choice for preemption (runtime.scheduling.preempt): pure, chosen by name."""

from __future__ import annotations

import pytest

from runtime.policy_names import UnknownPolicyError
from runtime.scheduling.headroom import Gate, HeadroomRule
from runtime.scheduling.preempt import (
    FairVictim,
    FewestGenerated,
    NoPreemption,
    Running,
    Standing,
)
from runtime.scheduling.registry import preemption_names, preemption_policy

pytestmark = pytest.mark.unit


def gen(key: str, tenant: str, generated: int, started_at: float = 0.0) -> Running:
    return Running(key, tenant, band=0, generated=generated, prompt_tokens=100,
                   started_at=started_at)  # fmt: skip


STANDING = {
    "light": Standing(share=8.0, held=2),  # under
    "flood": Standing(share=8.0, held=20),  # 1.5 shares over
    "busy": Standing(share=8.0, held=10),  # 0.25 shares over
}
RUNNING = [gen("f1", "flood", 50), gen("f2", "flood", 3), gen("b1", "busy", 0),
           gen("l1", "light", 0)]  # fmt: skip


def test_the_victim_is_most_over_its_share_then_least_progress():
    victim = FairVictim().victim("light", RUNNING, STANDING)
    assert victim is not None
    assert victim.key == "f2"


def test_ties_in_progress_go_to_the_one_started_last():
    running = [gen("a", "flood", 3, started_at=1.0), gen("b", "flood", 3, started_at=2.0)]
    victim = FairVictim().victim("light", running, STANDING)
    assert victim is not None
    assert victim.key == "b"


def test_excess_is_counted_in_shares_so_weights_compare():
    standing = {"light": Standing(2.0, 0), "heavy": Standing(16.0, 20), "small": Standing(2.0, 4)}
    running = [gen("h", "heavy", 0), gen("s", "small", 100)]
    victim = FairVictim().victim("light", running, standing)
    assert victim is not None
    assert victim.key == "s"


def test_no_victim_for_a_tenant_over_its_share_or_without_anyone_over():
    assert FairVictim().victim("busy", RUNNING, STANDING) is None
    assert FairVictim().victim("flood", RUNNING, STANDING) is None
    fair = {t: Standing(8.0, 8) for t in ("light", "flood", "busy")}
    assert FairVictim().victim("light", RUNNING, fair) is None


def test_the_given_judgment_overrides_held_against_share():
    standing = {"light": Standing(8.0, 9, over=False), "flood": Standing(8.0, 4, over=True)}
    victim = FairVictim().victim("light", [gen("f", "flood", 1)], standing)
    assert victim is not None
    assert victim.key == "f"
    standing["light"] = Standing(8.0, 0, over=True)
    assert FairVictim().victim("light", [gen("f", "flood", 1)], standing) is None


def test_a_tenant_never_preempts_itself_and_an_unseen_one_is_under():
    assert FairVictim().victim("light", [gen("l", "light", 0)], STANDING) is None
    victim = FairVictim().victim("newcomer", RUNNING, STANDING)
    assert victim is not None
    assert victim.key == "f2"


def test_resume_costs_the_prompt_plus_what_was_generated():
    assert gen("x", "t", 42).resume_tokens == 142


def test_policies_are_chosen_by_name():
    assert preemption_names() == ("fair", "fewest_generated", "off")
    assert isinstance(preemption_policy("fewest_generated"), FewestGenerated)
    assert isinstance(preemption_policy(" fair "), FairVictim)
    assert isinstance(preemption_policy("off"), NoPreemption)
    assert preemption_policy("off").victim("light", RUNNING, STANDING) is None
    with pytest.raises(UnknownPolicyError, match=r"known: fair, fewest_generated, off"):
        preemption_policy("lru")


def test_lending_counts_the_flooders_at_most_their_limit_against_the_others():
    gate = Gate(frozenset({"busy", "flood"}), limit=20,
                flooders=frozenset({"flood"}), flood_limit=8)  # fmt: skip
    inflight = {"busy": 10, "flood": 14}  # 6 slots lent to the flood
    assert gate.blocks("busy", inflight)  # without lending: 24 >= 20
    assert not gate.blocks("busy", inflight, lending=True)  # 10 + 8 < 20
    assert gate.blocks("flood", inflight, lending=True)
    assert gate.lent(inflight) == {"flood"}
    assert gate.lent({"busy": 10, "flood": 8}) == frozenset()
    assert gate.lent({"busy": 21, "flood": 0}) == {"busy", "flood"}


def test_fair_loses_the_fewest_tokens_to_re_prefill_fewest_generated_the_fewest_generated():
    long_prompt = Running("long", "flood", 0, generated=2, prompt_tokens=2000, started_at=0.0)
    short_prompt = Running("short", "flood", 0, generated=40, prompt_tokens=100, started_at=0.0)
    running = [long_prompt, short_prompt]
    fair = FairVictim().victim("light", running, STANDING)
    assert fair is not None
    assert fair.key == "short"  # 140 tokens to re-prefill against 2002
    fewest = FewestGenerated().victim("light", running, STANDING)
    assert fewest is not None
    assert fewest.key == "long"


def test_the_rule_s_shares_are_a_read_that_changes_nothing():
    def rule() -> HeadroomRule:
        r = HeadroomRule(fraction=0.25, window_s=10.0)
        r.note("flood", 1.0, now=0.0)
        r.note("light", 3.0, now=0.0)
        r.note("gone", 1.0, now=-20.0)
        return r

    looked, untouched = rule(), rule()
    assert looked.shares(inflight={"flood": 6}, queued={}, capacity=12, now=1.0) == {
        "flood": 3.0, "light": 9.0
    }
    args = {"inflight": {"flood": 6}, "queued": {"flood": 9}, "capacity": 12, "now": 2.0}
    assert looked.gate(**args) == untouched.gate(**args)  # type: ignore[arg-type]
