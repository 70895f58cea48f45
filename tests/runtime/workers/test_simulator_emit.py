"""The simulator's ``[[emit: ...]]`` test hook: the answer begins with the given words."""

from __future__ import annotations

import itertools

import pytest

from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.protocol import parse_chat, parse_completion
from runtime.workers.simulator.text import output_words, scripted_tokens

pytestmark = pytest.mark.unit

CONFIG = SimulatorConfig(model="m")


def test_markers_give_one_token_per_word_in_order() -> None:
    assert scripted_tokens("a [[emit: secret  phrase]] b [[emit:x]]") == (" secret", " phrase",
                                                                          " x")  # fmt: skip
    assert scripted_tokens("no marker") == ()
    words = list(itertools.islice(output_words((" secret",), seed=1), 3))
    assert words[0] == " secret"
    assert len(words) == 3  # then the seeded words go on


def test_a_request_runs_until_its_script_is_out_within_its_budget() -> None:
    chat = parse_chat({"model": "m", "messages": [
        {"role": "user", "content": "[[emit: " + "w " * 300 + "]]"}]}, CONFIG)  # fmt: skip
    assert len(chat.script) == 300
    assert chat.output_tokens >= 300  # it does not stop on its own before the script is out
    capped = parse_completion({"model": "m", "prompt": "[[emit: a b c]]", "max_tokens": 2}, CONFIG)
    assert (capped.script, capped.output_tokens, capped.finish_reason) == (
        (" a", " b", " c"), 2, "length")  # fmt: skip
