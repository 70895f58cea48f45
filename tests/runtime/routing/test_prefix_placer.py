"""The prefix placer (index + queued prefill + sticky rule) and the ``prefix`` stage's pieces:
which requests carry block hashes, the pool policy that turns it off, its validation."""

from __future__ import annotations

import msgspec
import pytest

from runtime.gateway.pipeline.stages.prefix import PoolRules, prefix_routing_on, prompt_prefix
from runtime.gateway.schema import ChatRequest, CompletionRequest, EmbeddingRequest
from runtime.pool_policies import pool_policy_errors
from runtime.routing.prefix import PromptPrefix, chat_block_hashes, render_chat
from runtime.routing.prefix_placer import PrefixPlacer
from runtime.routing.sticky import StickyRule
from runtime.testing.snapshots import endpoint_snap, version_snap

pytestmark = pytest.mark.unit

SYSTEM = "You are a careful assistant. " * 40  # ~1,160 characters: 4 full blocks


def chat(*messages: tuple[str, str]) -> ChatRequest:
    body = {"model": "m", "messages": [{"role": r, "content": c} for r, c in messages]}
    return msgspec.convert(body, ChatRequest)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_placer_sticks_to_the_cached_endpoint_until_its_queue_outweighs_the_saving() -> None:
    placer = PrefixPlacer(clock=Clock(), rule=StickyRule(stickiness=1.0))
    eps = [endpoint_snap(i, capacity=4) for i in (1, 2)]
    hashes = chat_block_hashes([("system", SYSTEM), ("user", "hi")])
    first = PromptPrefix(hashes=hashes, prompt_tokens=300)
    match = placer.match(first, eps)
    assert match.matched == {}
    assert placer.sticky(eps, match, lambda _: 0) is None  # nothing cached: route by load
    placer.sent(1, first, match)
    assert placer.queued_prefill(1) == 300
    # The first request's whole prefill is still queued at 1: waiting costs more than it saves.
    second = PromptPrefix(hashes=hashes, prompt_tokens=300)
    assert placer.sticky(eps, placer.match(second, eps), lambda _: 0) is None
    placer.started(first)
    placer.started(first)  # idempotent
    assert placer.queued_prefill(1) == 0
    match = placer.match(second, eps)
    assert match.matched == {1: len(hashes)}
    chosen = placer.sticky(eps, match, lambda e: 3 if e == 1 else 0)  # busier, still sticky
    assert chosen is not None
    assert chosen.id == 1
    placer.sent(1, second, match)
    assert placer.queued_prefill(1) == 300 - len(hashes) * 64  # only the uncached tail
    # Its batch is full: load decides.
    assert placer.sticky(eps, match, lambda e: 4 if e == 1 else 0) is None
    assert (placer.sticky_count, placer.by_load) == (1, 3)


def test_a_request_is_placed_by_its_pools_sticky_rule() -> None:
    """The stage puts the pool's rule (its policies) on the prefix; the placer applies it."""
    placer = PrefixPlacer(clock=Clock())  # the default rule: max_load 1.0
    eps = [endpoint_snap(i, capacity=4) for i in (1, 2)]
    version = version_snap(1, "m")
    rules = PoolRules()
    request = chat(("system", SYSTEM), ("user", "hi"))
    first = prompt_prefix(request, version, rules.rule({}))
    assert first is not None
    assert first.rule is None  # no key set: the placer's default
    placer.sent(1, first, placer.match(first, eps))
    placer.started(first)
    half_full = {1: 2, 2: 0}
    default = prompt_prefix(request, version, rules.rule({"prefix_routing": "on"}))
    assert default is not None
    chosen = placer.sticky(eps, placer.match(default, eps), half_full.__getitem__)
    assert chosen is not None
    assert chosen.id == 1
    # A pool that calls an endpoint saturated at half its capacity: load decides.
    policies = {"prefix_max_load": "0.5"}
    strict = prompt_prefix(request, version, rules.rule(policies))
    assert strict is not None
    assert strict.rule == StickyRule(max_load=0.5)
    assert placer.sticky(eps, placer.match(strict, eps), half_full.__getitem__) is None
    assert rules.rule(dict(policies)) is strict.rule  # parsed once per set of values


def test_the_sticky_rule_policies_are_validated_and_a_bad_one_keeps_its_default() -> None:
    good = {"prefix_stickiness": "4", "prefix_min_saved_tokens": "128",
            "prefix_slack_tokens": "256", "prefix_max_load": "0.9"}  # fmt: skip
    assert pool_policy_errors(good) == []
    assert pool_policy_errors({"prefix_stickiness": "inf"}) == []  # never leave for a queue
    assert StickyRule.from_policies(good) == StickyRule(
        min_saved_tokens=128, stickiness=4.0, slack_tokens=256, max_load=0.9
    )
    bad = {"prefix_stickiness": "-1", "prefix_min_saved_tokens": "1.5", "prefix_max_load": "x"}
    assert pool_policy_errors(bad) == [
        "prefix_min_saved_tokens: min_saved_tokens must be an integer, got '1.5'.",
        "prefix_stickiness: stickiness must be >= 0.",
        "prefix_max_load: max_load must be a number, got 'x'.",
    ]
    # The router never fails on a bad value: that parameter keeps its default.
    assert StickyRule.from_policies({**bad, "prefix_slack_tokens": "10"}) == StickyRule(
        slack_tokens=10
    )
    with pytest.raises(ValueError, match="prefix_max_load"):
        StickyRule.from_policies({"prefix_max_load": "0"}, strict=True)


def test_a_retry_moves_the_queued_prefill_and_the_index_learns_both() -> None:
    placer = PrefixPlacer(clock=Clock())
    eps = [endpoint_snap(i) for i in (1, 2)]
    prefix = PromptPrefix(hashes=(11, 12, 13), prompt_tokens=200)
    placer.sent(1, prefix, placer.match(prefix, eps))
    placer.sent(2, prefix, placer.match(prefix, eps))
    assert (placer.queued_prefill(1), placer.queued_prefill(2)) == (0, 200)
    assert placer.match(prefix, eps).matched == {1: 3, 2: 3}
    placer.retain([2])  # endpoint 1 left the snapshot
    assert placer.match(prefix, eps).matched == {2: 3}


def test_the_index_forgets_after_its_ttl() -> None:
    clock = Clock()
    placer = PrefixPlacer(clock=clock)
    placer.index.ttl_seconds = 10.0
    eps = [endpoint_snap(1)]
    prefix = PromptPrefix(hashes=(1, 2), prompt_tokens=10)
    placer.sent(1, prefix, placer.match(prefix, eps))
    assert placer.match(prefix, eps).matched == {1: 2}
    clock.now = 11.0
    assert placer.match(prefix, eps).matched == {}


def test_chat_messages_in_order_share_a_system_prompt_and_a_history() -> None:
    version = version_snap(1, "m")
    one = prompt_prefix(chat(("system", SYSTEM), ("user", "first question")), version)
    two = prompt_prefix(chat(("system", SYSTEM), ("user", "another one")), version)
    assert one is not None
    assert two is not None
    assert one.hashes[:4] == two.hashes[:4]
    history = [("system", SYSTEM), ("user", "q" * 300), ("assistant", "a" * 300)]
    turn = prompt_prefix(chat(*history), version)
    later = prompt_prefix(chat(*history, ("user", "next")), version)
    assert turn is not None
    assert later is not None
    assert later.hashes[: len(turn.hashes)] == turn.hashes
    # An adapter's blocks are cached apart from its base model's.
    adapter = version_snap(2, "m", base_version=1)
    lora = prompt_prefix(chat(("system", SYSTEM), ("user", "first question")), adapter)
    assert lora is not None
    assert lora.hashes[0] != one.hashes[0]


def test_the_prompt_tokens_are_estimated_in_the_unit_of_the_cached_ones() -> None:
    """Not the plan's count: without a tokenizer that is one token a byte, four times what the
    index's cached tokens mean, and a conversation's next turn looked 4x costlier to queue than
    the history it saves (the harness's conversations left their engine at 8 requests/s)."""
    version = version_snap(1, "m")
    messages = [("system", SYSTEM), ("user", "q" * 300), ("assistant", "a" * 300),
                ("user", "next question")]  # fmt: skip
    turn = prompt_prefix(chat(*messages), version)
    assert turn is not None
    assert turn.prompt_tokens == -(-len(render_chat(messages)) // 4) == 451
    # Uncached where the whole history is held: the new message and the last partial block.
    held = len(turn.hashes)
    assert turn.uncached_tokens(held) == turn.prompt_tokens - held * 64
    assert turn.uncached_tokens(held) < 64


def test_only_single_prompts_with_a_full_block_carry_hashes() -> None:
    version = version_snap(1, "m")
    assert prompt_prefix(chat(("user", "short")), version) is None
    text = msgspec.convert({"model": "m", "prompt": SYSTEM}, CompletionRequest)
    completion = prompt_prefix(text, version)
    assert completion is not None
    assert len(completion.hashes) == 4
    batch = msgspec.convert({"model": "m", "prompt": [SYSTEM, SYSTEM]}, CompletionRequest)
    assert prompt_prefix(batch, version) is None
    embedding = msgspec.convert({"model": "m", "input": SYSTEM}, EmbeddingRequest)
    assert prompt_prefix(embedding, version) is None


def test_prefix_routing_is_on_unless_the_pool_turns_it_off() -> None:
    assert prefix_routing_on({})
    assert prefix_routing_on({"prefix_routing": "on"})
    assert not prefix_routing_on({"prefix_routing": "off"})
    assert pool_policy_errors({"prefix_routing": "off"}) == []
    assert pool_policy_errors({"prefix_routing": "sometimes"}) == [
        "prefix_routing must be 'on' or 'off', got 'sometimes'."
    ]


def test_a_pools_rule_is_parsed_once_and_follows_a_new_snapshots_policies() -> None:
    rules = PoolRules()
    policies = {"prefix_stickiness": "4"}
    rule = rules.rule(policies)
    assert rule == StickyRule(stickiness=4.0)
    assert rules.rule(policies) is rule  # the same snapshot's policies: remembered
    assert rules.rule({"prefix_stickiness": "4"}) is rule  # equal values: parsed once
    assert rules.rule({"prefix_stickiness": "3"}) == StickyRule(stickiness=3.0)
    assert rules.rule({}) is None  # no key set: the placer's default


def test_nothing_cached_anywhere_routes_by_load_without_weighing_candidates() -> None:
    placer = PrefixPlacer(clock=Clock())
    eps = [endpoint_snap(i, capacity=4) for i in (1, 2)]
    short = PromptPrefix(hashes=chat_block_hashes([("user", "x" * 300)]), prompt_tokens=80)
    placer.sent(1, short, placer.match(short, eps))  # one block (64 tokens) cached at 1
    placer.started(short)

    def no_inflight_lookup(endpoint_id: int) -> int:
        raise AssertionError("the rule has nothing to weigh")

    fresh = PromptPrefix(hashes=chat_block_hashes([("user", "y" * 300)]), prompt_tokens=80)
    assert placer.sticky(eps, placer.match(fresh, eps), no_inflight_lookup) is None
    rule = StickyRule(min_saved_tokens=65)  # the one cached block saves too little
    again = PromptPrefix(hashes=short.hashes, prompt_tokens=80, rule=rule)
    assert placer.sticky(eps, placer.match(again, eps), no_inflight_lookup) is None
    assert placer.by_load == 2
    chosen = placer.sticky(eps, placer.match(short, eps), lambda _: 0)  # 64 >= 64: it sticks
    assert chosen is not None
    assert chosen.id == 1


def test_a_unary_requests_prefill_is_not_counted_as_queued() -> None:
    """Its first byte is its whole answer: counting its prefill until then would make its
    endpoint look loaded for its whole decode."""
    version = version_snap(1, "m")
    request = chat(("system", SYSTEM), ("user", "hi"))
    unary = prompt_prefix(request, version, stream=False)
    streamed = prompt_prefix(request, version)
    assert unary is not None
    assert streamed is not None
    placer = PrefixPlacer(clock=Clock())
    eps = [endpoint_snap(1, capacity=4)]
    placer.sent(1, unary, placer.match(unary, eps))
    assert placer.queued_prefill(1) == 0
    assert placer.index.blocks(1) == len(unary.hashes)  # the index still learns
    fresh = PrefixPlacer(clock=Clock())
    fresh.sent(1, streamed, fresh.match(streamed, eps))
    assert fresh.queued_prefill(1) == streamed.prompt_tokens
