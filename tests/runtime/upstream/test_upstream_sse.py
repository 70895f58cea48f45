"""The SSE decoder: framing rules, and chunk boundaries never change the result."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.upstream import SSEDecoder

pytestmark = pytest.mark.unit


def decode(chunks: list[bytes]) -> list[bytes]:
    decoder = SSEDecoder()
    out: list[bytes] = []
    for chunk in chunks:
        out.extend(decoder.feed(chunk))
    return out


def test_vllm_style_stream() -> None:
    raw = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    assert decode([raw]) == [b'{"a":1}', b'{"b":2}', b"[DONE]"]


def test_one_byte_at_a_time() -> None:
    raw = b'data: {"a":1}\r\n\r\ndata: x\r\rdata: y\n\n'
    assert decode([raw[i : i + 1] for i in range(len(raw))]) == [b'{"a":1}', b"x", b"y"]


def test_multiline_data_comments_and_other_fields() -> None:
    raw = b": keep-alive\nevent: message\nid: 3\ndata: line1\ndata:line2\nretry: 10\n\n"
    assert decode([raw]) == [b"line1\nline2"]


def test_event_without_data_is_not_dispatched_but_empty_data_is() -> None:
    assert decode([b"event: ping\n\n: c\n\ndata\n\ndata:\n\n"]) == [b"", b""]


def test_only_one_space_after_the_colon_is_stripped() -> None:
    assert decode([b"data:  two\n\n"]) == [b" two"]


def test_field_names_that_merely_start_with_data_are_ignored() -> None:
    assert decode([b"database: x\ndata: y\n\n"]) == [b"y"]


def test_bom_is_skipped_even_when_split() -> None:
    assert decode([b"\xef", b"\xbb", b"\xbfdata: a\n\n"]) == [b"a"]
    assert decode([b"\xef\xbb\xbfdata: a\n\n"]) == [b"a"]


def test_crlf_split_across_chunks_counts_once() -> None:
    assert decode([b"data: a\r", b"\n\r", b"\n"]) == [b"a"]
    # two lone CRs in separate chunks are two line ends: the second ends the event
    assert decode([b"data: a\r", b"\r", b"data: b\r", b"\r"]) == [b"a", b"b"]


def test_pending_reports_an_unfinished_event() -> None:
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n") == []
    assert decoder.pending
    assert decoder.feed(b"\n") == [b"a"]
    assert not decoder.pending
    decoder.feed(b"data: b")
    assert decoder.pending


# Payload lines: any bytes but CR and LF (what one data line can carry).
_line = st.binary(max_size=40).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))
_eol = st.sampled_from([b"\n", b"\r\n", b"\r"])


@st.composite
def streams(draw: st.DrawFn) -> tuple[bytes, list[bytes]]:
    """A well-formed event stream and the payloads it carries.

    One line-end style per stream: a CR line end followed by an LF one would read as CRLF.
    """
    eol = draw(_eol)
    raw = b""
    payloads: list[bytes] = []
    for _ in range(draw(st.integers(0, 8))):
        lines = draw(st.lists(_line, min_size=1, max_size=3))
        if draw(st.booleans()):
            raw += b": comment" + eol
        if draw(st.booleans()):
            raw += b"event: message" + eol
        for line in lines:
            sep = draw(st.sampled_from([b"data: ", b"data:"]))
            if sep == b"data:" and line.startswith(b" "):
                sep = b"data: "  # "data:" + " x" would lose the payload's own leading space
            raw += sep + line + eol
        raw += eol
        payloads.append(b"\n".join(lines))
    return raw, payloads


@settings(max_examples=300, deadline=None)
@given(data=streams(), cuts=st.lists(st.integers(0, 10_000), max_size=20))
def test_any_chunking_decodes_the_same(data: tuple[bytes, list[bytes]], cuts: list[int]) -> None:
    raw, payloads = data
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    chunks = [raw[a:b] for a, b in itertools.pairwise(points)]
    assert decode(chunks) == payloads
    assert decode([raw]) == payloads


def framed(chunks: list[bytes]) -> list[tuple[bytes | None, list[bytes]]]:
    decoder = SSEDecoder()
    return [decoder.feed_framed(chunk) for chunk in chunks]


def test_a_chunk_of_whole_data_events_comes_back_as_it_came() -> None:
    one, two = b'data: {"a":1}\n\n', b'data: {"b":2}\n\ndata: [DONE]\n\n'
    assert framed([one, two]) == [(one, [b'{"a":1}']), (two, [b'{"b":2}', b"[DONE]"])]
    assert framed([one])[0][0] is one  # the very bytes: nothing copied


@pytest.mark.parametrize(
    "chunks",
    [
        [b"data: a\n", b"\ndata: b\n\n"],  # the second chunk finishes an event begun before
        [b"data: a\r\n\r\n"],  # CRLF line ends
        [b"data:a\n\n"],  # no space after the colon: the client would get other bytes
        [b": ping\ndata: a\n\n"],  # a comment
        [b"event: x\ndata: a\n\n"],  # another field
        [b"data: a\ndata: b\n\n"],  # two data lines, one event
        [b"data: a\n\n\ndata: b\n\n"],  # a blank line more
        [b"\xef\xbb\xbfdata: a\n\n"],  # a BOM
    ],
)
def test_a_chunk_that_is_not_exactly_the_framing_comes_back_without_its_bytes(
    chunks: list[bytes],
) -> None:
    got = framed(chunks)
    assert got[-1][0] is None
    assert [p for _, payloads in got for p in payloads] == decode(chunks)


@settings(max_examples=300, deadline=None)
@given(data=streams(), cuts=st.lists(st.integers(0, 10_000), max_size=20))
def test_framed_feeding_decodes_the_same_and_its_bytes_are_exactly_the_framing(
    data: tuple[bytes, list[bytes]], cuts: list[int]
) -> None:
    raw, payloads = data
    points = sorted({c % (len(raw) + 1) for c in cuts} | {0, len(raw)})
    chunks = [raw[a:b] for a, b in itertools.pairwise(points)]
    got = framed(chunks)
    assert [p for _, batch in got for p in batch] == payloads
    for chunk, batch in got:
        if chunk is not None:
            assert chunk == b"".join(b"data: " + p + b"\n\n" for p in batch)
