"""Bad input never gets a 5xx and never hangs: hypothesis over request bodies and headers.

Bodies: arbitrary bytes, valid JSON with bytes flipped (invalid UTF-8 included), and JSON
documents shaped like the OpenAI schema with wrong-typed, out-of-range and extra values.
Every answer must come within the client's timeout and be below 500, with an OpenAI error
document when it is a refusal.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fuzz_target import CHAT_MODEL, EMBED_MODEL, Target
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = pytest.mark.integration

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/embeddings")
CLIENT_TIMEOUT_S = 10.0
FUZZ = settings(
    max_examples=120,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=20),
)
json_value = st.recursive(
    json_leaf,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
part = st.one_of(
    st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=30)}),
    st.fixed_dictionaries({"type": st.just("image_url"), "image_url": json_value}),
    json_value,
)
message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "system", "assistant", "tool", "developer", ""])
        | json_value,
        "content": st.text(max_size=40) | st.lists(part, max_size=3) | json_value,
        "tool_calls": json_value,
        "tool_call_id": json_value,
        "name": json_value,
    },
)
small_int = st.integers(min_value=-3, max_value=12)
token_ids = st.lists(st.integers(min_value=-5, max_value=600), max_size=6)
document = st.fixed_dictionaries(
    {},
    optional={
        "model": st.sampled_from([CHAT_MODEL, EMBED_MODEL, "", "nope"]) | json_value,
        "messages": st.lists(message, max_size=3) | json_value,
        "prompt": st.text(max_size=40)
        | st.lists(st.text(max_size=10), max_size=3)
        | token_ids
        | st.lists(token_ids, max_size=3)
        | json_value,
        "input": st.text(max_size=40)
        | st.lists(st.text(max_size=10), max_size=3)
        | token_ids
        | st.lists(token_ids, max_size=3)
        | json_value,
        "max_tokens": small_int | json_value,
        "max_completion_tokens": small_int | json_value,
        "n": small_int | json_value,
        "stream": st.booleans() | json_value,
        "stream_options": st.fixed_dictionaries({}, optional={"include_usage": json_value})
        | json_value,
        "temperature": st.floats(min_value=-1, max_value=3) | json_value,
        "seed": json_value,
        "user": json_value,
        "priority": json_value,
        "encoding_format": st.sampled_from(["float", "base64", "x"]),
        "dimensions": json_value,
        "tools": json_value,
        "logprobs": json_value,
    },
).flatmap(
    lambda doc: st.dictionaries(st.text(max_size=10), json_value, max_size=3).map(
        lambda extra: {**extra, **doc}
    )
)


@pytest.fixture(scope="module")
def http(target: Target) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {target.key}"}
    with httpx.Client(
        base_url=target.base_url, headers=headers, timeout=CLIENT_TIMEOUT_S
    ) as client:
        yield client


def check(resp: httpx.Response) -> None:
    assert resp.status_code < 500, (resp.status_code, resp.text[:500])
    if resp.status_code >= 400:
        error = resp.json()["error"]
        assert set(error) == {"message", "type", "param", "code"}, error
    if resp.status_code == 200 and "text/event-stream" in resp.headers.get("content-type", ""):
        assert resp.text.endswith("data: [DONE]\n\n")


@FUZZ
@given(route=st.sampled_from(ROUTES), body=st.binary(max_size=600))
def test_arbitrary_bytes(http: httpx.Client, route: str, body: bytes) -> None:
    check(http.post(route, content=body))


VALID = json.dumps(
    {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "h\u00e9llo"}], "max_tokens": 2}
).encode()


@FUZZ
@given(
    position=st.integers(min_value=0, max_value=len(VALID) - 1),
    junk=st.binary(min_size=1, max_size=4),
)
def test_flipped_bytes_in_a_valid_body(http: httpx.Client, position: int, junk: bytes) -> None:
    check(
        http.post("/v1/chat/completions", content=VALID[:position] + junk + VALID[position + 1 :])
    )


@settings(FUZZ, max_examples=90)
@given(route=st.sampled_from(ROUTES), doc=document)
def test_schema_shaped_documents(http: httpx.Client, route: str, doc: dict[str, Any]) -> None:
    check(http.post(route, content=json.dumps(doc).encode()))


latin1 = st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=255), max_size=12)


@settings(FUZZ, max_examples=50)
@given(
    timeout=latin1
    | st.sampled_from(["0", "0.0001", "-1", "nan", "inf", "-inf", "1e309", "1e-9", " 2 "]),
    klass=st.none() | latin1,
)
def test_nonsense_headers(http: httpx.Client, timeout: str, klass: str | None) -> None:
    headers = {"X-Request-Timeout": timeout.strip().encode("latin-1") or b"x"}
    if klass is not None:
        headers["X-Switchyard-Class"] = klass.strip().encode("latin-1")
    body = {"model": CHAT_MODEL, "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}
    check(http.post("/v1/chat/completions", json=body, headers=headers))
