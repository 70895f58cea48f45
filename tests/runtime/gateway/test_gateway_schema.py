"""Request decoding: 400 for malformed JSON or bad router-read fields (with the field path);
everything else is kept in the document, to be forwarded unchanged."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from runtime.gateway.errors import ApiError
from runtime.gateway.schema import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    RequestDecoder,
    decode_request,
    error_param,
)

pytestmark = pytest.mark.unit

CHAT = RequestDecoder(ChatRequest)
COMPLETION = RequestDecoder(CompletionRequest)
EMBEDDING = RequestDecoder(EmbeddingRequest)


def refused(body: bytes, decoder: RequestDecoder[Any] = CHAT) -> ApiError:
    with pytest.raises(ApiError) as info:
        decode_request(body, decoder)
    return info.value


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ("Object missing required field `model`", "model"),
        ("Object missing required field `role` - at `$.messages[0]`", "messages[0].role"),
        ("Expected `int | null`, got `str` - at `$.max_tokens`", "max_tokens"),
        (
            "Expected `str | null`, got `int` - at `$.messages[0].content[1].text`",
            "messages[0].content[1].text",
        ),
        ("Expected `object`, got `array`", None),
    ],
)
def test_error_param(message: str, param: str | None) -> None:
    assert error_param(message) == param


@pytest.mark.parametrize(
    "body",
    [
        b"{nope",
        b"",
        b'{"model": "m", "messages": [{"role": "user", "content": "\xff\xfe"}]}',
        b'{"model": "m\xc3", "messages": []}',
        b'{"model": "m", "messages": [{"role": "user", "content": "\\ud800"}]}',
    ],
    ids=["truncated", "empty", "bad_utf8_in_content", "bad_utf8_in_model", "lone_surrogate"],
)
def test_not_json_or_not_utf8_is_400_invalid_json(body: bytes) -> None:
    error = refused(body)
    assert (error.status, error.type, error.code) == (400, "invalid_request_error", "invalid_json")


@pytest.mark.parametrize(
    ("body", "param"),
    [
        (b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', "messages[0].content"),
        (b'{"messages": [{"role": "user", "content": "x"}]}', "model"),
        (b'{"model": "m"}', "messages"),
        (b'{"model": "m", "messages": []}', "messages"),
        (b'{"model": "m", "messages": [{"content": "x"}]}', "messages[0].role"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": "ten"}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user"}], "max_tokens": 0}', "max_tokens"),
        (b'{"model": "m", "messages": [{"role": "user"}], "n": 0}', "n"),
        (b'{"model": "m", "messages": [{"role": "user"}], "temperature": -1}', "temperature"),
        (b'{"model": "m", "messages": [{"role": "user"}], "stream": "yes"}', "stream"),
        (b'{"model": "", "messages": [{"role": "user"}]}', "model"),
        (b"[1, 2]", None),
    ],
)
def test_bad_router_fields_are_400_invalid_value_with_param(body: bytes, param: str | None) -> None:
    error = refused(body)
    assert (error.status, error.type, error.code) == (400, "invalid_request_error", "invalid_value")
    assert error.param == param


def test_unknown_fields_messages_and_parts_are_kept_verbatim() -> None:
    document = {
        "model": "m",
        "messages": [
            {"role": "system", "content": "be brief", "name": "ops"},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "look at "},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA"}},
                    {"type": "input_audio", "input_audio": {"data": "AA", "format": "wav"}},
                    {"type": "text", "text": "this"},
                ],
            },
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "f", "arguments": "{}"},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": "42"},
        ],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
        "tool_choice": "auto",
        "response_format": {"type": "json_object"},
        "logprobs": True,
        "top_logprobs": 2,
        "logit_bias": {"50256": -100},
        "top_k": 5,
        "ignore_eos": True,
        "metadata": {"a": "b"},
        "n": 2,
        "seed": 7,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    decoded = decode_request(msgspec.json.encode(document), CHAT)
    assert decoded.document == document
    request = decoded.request
    assert request.texts() == ["be brief", "look at this", "", "42"]
    assert request.choices == 2
    assert request.include_usage
    assert request.seed == 7


def test_max_completion_tokens_wins() -> None:
    request = decode_request(
        b'{"model": "m", "max_tokens": 9, "max_completion_tokens": 5, "messages": ['
        b'{"role": "user", "content": "x"}]}',
        CHAT,
    ).request
    assert request.requested_max_tokens() == 5
    assert not request.streaming
    assert request.choices == 1


@pytest.mark.parametrize(
    ("value", "texts", "extras"),
    [
        ("one", ["one"], [0]),
        (["a", "bc"], ["a", "bc"], [0, 0]),
        ([1, 2, 3], [""], [3]),
        ([[1, 2], [3]], ["", ""], [2, 1]),
    ],
    ids=["string", "strings", "token_array", "token_arrays"],
)
def test_prompt_and_input_shapes(value: Any, texts: list[str], extras: list[int]) -> None:
    completion = decode_request(msgspec.json.encode({"model": "m", "prompt": value}), COMPLETION)
    assert completion.request.inputs() == (texts, extras)
    body = {"model": "e", "input": value, "encoding_format": "base64", "dimensions": 8}
    embedding = decode_request(msgspec.json.encode(body), EMBEDDING)
    assert embedding.request.inputs() == (texts, extras)
    assert embedding.document == body


@pytest.mark.parametrize("value", [[], ["a", 1], [[1], "a"], {"a": 1}, None])
def test_bad_inputs_are_400_naming_input(value: Any) -> None:
    body = msgspec.json.encode({"model": "e", "input": value})
    with pytest.raises(ApiError) as info:
        decode_request(body, EMBEDDING).request.inputs()
    assert (info.value.status, info.value.param) == (400, "input")
