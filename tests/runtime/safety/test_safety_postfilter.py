"""The streaming post-filter: matches across chunks, one chunk at most late, O(delta) state."""

from __future__ import annotations

import random

import pytest

from runtime.safety.compiled import CompiledPack, compile_pack
from runtime.safety.postfilter import Stop, StreamFilter, check_text
from tests.runtime.safety.packs import pack, rule, twenty_rule_pack

pytestmark = pytest.mark.unit

PHRASE = "forbidden phrase"


def packs() -> tuple[CompiledPack, ...]:
    return (compile_pack(pack("out", 2,
        rule("banned", "terms", "stop", terms=(PHRASE, "bad")),
        rule("cards", "pii", "stop", detectors=("credit_card",)),
        rule("in-only", "terms", "refuse", terms=("harmless",)))),)  # fmt: skip


def run(chunks: list[str]) -> tuple[int | None, Stop | None]:
    """The index of the chunk whose feed stopped (len(chunks) = at finish), and the stop."""
    stream = StreamFilter(packs())
    for i, chunk in enumerate(chunks):
        stop = stream.feed(chunk)
        if stop is not None:
            return i, stop
    stop = stream.finish()
    return (len(chunks), stop) if stop else (None, None)


def test_a_clean_stream_never_stops() -> None:
    assert run(["a harmless ", "answer about ", "badges and ", "badminton."]) == (None, None)


def test_a_phrase_split_across_chunks_is_caught_in_the_chunk_that_completes_it() -> None:
    at, stop = run(["Here is the forb", "idden ", "phrase.", " more"])
    assert at == 2
    assert stop == Stop("out", "banned", "banned", emit="")
    at, stop = run(["ok ", "Forbidden PHRASE", ", then"])  # case-insensitive by default
    assert at == 2  # ends in a word character at the chunk's end: decided on the next delta
    assert stop is not None
    assert stop.emit == ""


def test_emit_is_the_part_of_the_delta_before_the_match() -> None:
    at, stop = run(["all good ", "until bad things"])
    assert at == 1
    assert stop is not None
    assert stop.emit == "until "


def test_a_match_held_back_at_the_end_is_decided_by_finish() -> None:
    assert run(["that is bad"]) == (1, Stop("out", "banned", "banned", emit=""))
    assert run(["that is bad", "ge"]) == (None, None)  # "badge": not the term


def test_a_card_number_streamed_digit_groups_at_a_time() -> None:
    at, stop = run(["card: 4111 ", "1111 ", "1111 ", "1111", " thanks"])
    assert at == 4
    assert stop is not None
    assert stop.rule == "cards"


def test_every_split_of_the_phrase_is_caught() -> None:
    text = f"so the {PHRASE} is here"
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(1, 8)))
        chunks = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True)]
        at, stop = run(chunks)
        assert stop is not None, chunks
        assert stop.rule == "banned"
        done = len(text) - len(text.split(PHRASE)[1])  # where the phrase ends
        completes = next(i for i, end in enumerate(
            sum(len(c) for c in chunks[: i + 1]) for i in range(len(chunks))) if end >= done)
        assert at is not None
        assert at <= completes + 1, chunks  # within one chunk of appearing


def test_the_tail_stays_bounded_and_no_false_boundary_at_its_start() -> None:
    stream = StreamFilter(packs())
    for _ in range(1000):
        assert stream.feed("lorem ipsum dolor sit amet ") is None
    assert len(stream._tail) <= 24  # the longest match (a card number) + 1
    # The tail (the last 24 characters) may start right after the "x" of "xbad": its first
    # character is context only, so "bad" is not found there with a false word boundary.
    cut = StreamFilter(packs())
    assert cut.feed("xbad " + "z" * 20) is None
    assert cut._tail.startswith("bad ")
    assert cut.feed("more") is None


def test_input_rules_do_not_stop_the_output_and_no_rules_is_inactive() -> None:
    assert not StreamFilter(()).active
    assert StreamFilter(()).feed("bad") is None
    assert StreamFilter(packs()).active


def test_the_unary_check() -> None:
    assert check_text(packs(), "this is fine, harmless") is None
    assert check_text(packs(), f"a {PHRASE}!") == Stop("out", "banned", "banned", emit="a ")
    twenty = (compile_pack(twenty_rule_pack()),)
    stop = check_text(twenty, "the zebra crossing now")
    assert stop is not None
    assert stop.rule == "banned-out"


def test_after_a_stop_further_feeds_return_the_same_stop() -> None:
    stream = StreamFilter(packs())
    first = stream.feed("bad news ")
    assert first is not None
    assert stream.feed("anything") is first
    assert stream.finish() is first


def test_streaming_agrees_with_the_unary_check_on_random_texts_and_splits() -> None:
    """Whatever the chunking, the stream stops iff the whole answer has a stop match."""
    compiled = (compile_pack(twenty_rule_pack()), *packs())
    words = ["the", "zebra", "crossing", "now", "forbidden", "phrase", "bad", "badge", "code-2-",
             "12345", "4111", "1111", "123-45-6789", "tag8:", "abcdef", "blockedterm5x3", ",", "."]
    rng = random.Random(11)
    stopped = 0
    for _ in range(300):
        text = " ".join(rng.choice(words) for _ in range(rng.randint(3, 25)))
        expected = check_text(compiled, text)
        stream = StreamFilter(compiled)
        cuts = sorted(rng.sample(range(1, len(text)), min(len(text) - 1, rng.randint(1, 12))))
        stop = None
        for a, b in zip([0, *cuts], [*cuts, len(text)], strict=True):
            stop = stream.feed(text[a:b])
            if stop is not None:
                break
        stop = stop or stream.finish()
        assert (stop is None) == (expected is None), (text, cuts, stop, expected)
        stopped += stop is not None
    assert 50 < stopped < 290  # the texts exercise both outcomes
