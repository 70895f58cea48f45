"""The chaos traffic's SSE reader splits lines only where SSE does (LF, CRLF)."""

from __future__ import annotations

import json

import pytest
from traffic import classify_stream, sse_lines

pytestmark = pytest.mark.unit


def test_unicode_line_separators_inside_json_do_not_split_an_event() -> None:
    chunk = {"choices": [{"index": 0, "delta": {"content": "a\u2028b\x85c\u2029"}}]}
    last = {"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}
    body = (
        "".join(f"data: {json.dumps(event, ensure_ascii=False)}\r\n\r\n" for event in (chunk, last))
        + "data: [DONE]\n\n"
    )
    raw = body.encode()
    pieces = [raw[i : i + 5] for i in range(0, len(raw), 5)]  # splits inside UTF-8 sequences
    lines = [line[6:] for line in sse_lines(pieces) if line.startswith("data: ")]
    assert json.loads(lines[0]) == chunk
    assert lines[-1] == "[DONE]"
    assert classify_stream(lines)[0] == "ok"
