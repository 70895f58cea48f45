"""Unit tests for the simulator's timing model, capacity, config and stand-in tokenizer."""

from __future__ import annotations

import math

import pytest

from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.text import (
    GENERATION_PROMPT_TOKENS,
    MESSAGE_OVERHEAD_TOKENS,
    WordStream,
    count_chat_tokens,
    count_text_tokens,
    derive_seed,
    embedding_vector,
)
from runtime.workers.simulator.timing import Capacity, TimingModel

pytestmark = pytest.mark.unit


def test_decode_step_is_linear_in_batch_size():
    timing = TimingModel(prefill_tps=1000, decode_a_ms=10, decode_b_ms=0.5)
    assert timing.decode_step_seconds(1) == pytest.approx(0.0105)
    assert timing.decode_step_seconds(64) == pytest.approx(0.042)
    assert timing.decode_step_seconds(0) == 0.0


def test_prefill_takes_prompt_over_throughput():
    timing = TimingModel(prefill_tps=2000)
    assert timing.prefill_seconds(1000) == pytest.approx(0.5)
    assert timing.prefill_seconds(0) == 0.0


def test_step_adds_prefill_of_admitted_prompts_to_the_decode_step():
    timing = TimingModel(prefill_tps=1000, decode_a_ms=10, decode_b_ms=1)
    assert timing.step_seconds(batch_size=4, prefill_tokens=500) == pytest.approx(0.5 + 0.014)
    assert timing.step_seconds(batch_size=0, prefill_tokens=0) == 0.0


def test_throughput_grows_with_batch_but_per_sequence_speed_drops():
    timing = TimingModel(decode_a_ms=10, decode_b_ms=0.5)
    assert timing.tokens_per_second(64) > timing.tokens_per_second(1)
    assert timing.decode_step_seconds(64) > timing.decode_step_seconds(1)
    assert timing.tokens_per_second(1) == pytest.approx(1 / 0.0105)
    assert math.isinf(TimingModel(decode_a_ms=0, decode_b_ms=0).tokens_per_second(1))


@pytest.mark.parametrize(
    "kwargs",
    [{"prefill_tps": 0}, {"prefill_tps": -1}, {"decode_a_ms": -1}, {"decode_b_ms": -0.1}],
)
def test_timing_rejects_nonsense(kwargs):
    with pytest.raises(ValueError, match="must be"):
        TimingModel(**kwargs)


def test_timing_rejects_negative_inputs():
    timing = TimingModel()
    with pytest.raises(ValueError, match="prompt_tokens"):
        timing.prefill_seconds(-1)
    with pytest.raises(ValueError, match="batch_size"):
        timing.decode_step_seconds(-1)


def test_capacity_admits_within_both_limits():
    cap = Capacity(max_num_seqs=2, kv_capacity_tokens=100)
    assert cap.admits(running=0, kv_used=0, kv_needed=100)
    assert not cap.admits(running=0, kv_used=1, kv_needed=100)
    assert cap.admits(running=1, kv_used=50, kv_needed=50)
    assert not cap.admits(running=2, kv_used=0, kv_needed=1)


def test_kv_usage_is_a_fraction():
    cap = Capacity(kv_capacity_tokens=200)
    assert cap.kv_usage(0) == 0.0
    assert cap.kv_usage(50) == 0.25
    assert cap.kv_usage(400) == 1.0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"max_num_seqs": 0}, "max_num_seqs"), ({"kv_capacity_tokens": 0}, "kv_capacity_tokens")],
)
def test_capacity_rejects_nonsense(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Capacity(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"model": ""}, "model"),
        ({"model": "m", "max_model_len": 1}, "max_model_len"),
        ({"model": "m", "max_model_len": 4096, "capacity": Capacity(kv_capacity_tokens=100)},
         "one full-length sequence"),
        ({"model": "m", "fail_after_tokens": -1}, "fail_after_tokens"),
        ({"model": "m", "embedding_dim": 0}, "embedding_dim"),
    ],
)  # fmt: skip
def test_config_rejects_nonsense(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SimulatorConfig(**kwargs)


def test_config_defaults_match_the_cli_defaults():
    config = SimulatorConfig(model="m")
    assert config.timing == TimingModel(prefill_tps=5000, decode_a_ms=10, decode_b_ms=0.5)
    assert config.capacity == Capacity(max_num_seqs=64, kv_capacity_tokens=65536)
    assert config.max_model_len == 4096


def test_stand_in_tokenizer_counts_four_characters_per_token():
    assert count_text_tokens("") == 1
    assert count_text_tokens("abcd") == 1
    assert count_text_tokens("abcde") == 2
    assert count_text_tokens("x" * 4000) == 1000


def test_chat_prompt_adds_template_overhead():
    assert count_chat_tokens(["abcd", "abcdefgh"]) == (
        3 + 2 * MESSAGE_OVERHEAD_TOKENS + GENERATION_PROMPT_TOKENS
    )


def test_word_stream_is_deterministic_per_seed():
    first = [next(WordStream(7)) for _ in range(1)]
    stream_a, stream_b = WordStream(7), WordStream(7)
    words_a = [next(stream_a) for _ in range(50)]
    assert words_a == [next(stream_b) for _ in range(50)]
    assert words_a[:1] == first
    assert all(word.startswith(" ") and word.strip() for word in words_a)
    other = WordStream(8)
    assert [next(other) for _ in range(50)] != words_a


def test_derive_seed_is_stable_and_sensitive():
    assert derive_seed(0, None, "hello") == derive_seed(0, None, "hello")
    assert derive_seed(0, None, "hello") != derive_seed(1, None, "hello")
    assert derive_seed(0, 5, "hello") != derive_seed(0, None, "hello")
    assert 0 <= derive_seed("x") < 2**64


def test_embedding_vectors_are_deterministic_unit_vectors():
    vector = embedding_vector(42, 16)
    assert len(vector) == 16
    assert math.fsum(v * v for v in vector) == pytest.approx(1.0)
    assert vector == embedding_vector(42, 16)
    assert vector != embedding_vector(43, 16)
