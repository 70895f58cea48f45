"""Request decoding: 400 for malformed JSON, 422 with the field path, what is forwarded."""

from __future__ import annotations

import msgspec
import pytest

from runtime.gateway.errors import ApiError
from runtime.gateway.schema import (
    ChatRequest,
    CompletionRequest,
    EmbeddingRequest,
    decode_request,
    error_param,
    forwardable,
)

pytestmark = pytest.mark.unit

CHAT = msgspec.json.Decoder(ChatRequest)


@pytest.mark.parametrize(
    ("message", "param"),
    [
        ("Object missing required field `model`", "model"),
        ("Object missing required field `role` - at `$.messages[0]`", "messages[0].role"),
        ("Object contains unknown field `tools`", "tools"),
        ("Expected `int | null`, got `str` - at `$.max_tokens`", "max_tokens"),
        (
            "Invalid enum value 'x' - at `$.messages[0].content[1].type`",
            "messages[0].content[1].type",
        ),
        ("Expected `object`, got `array`", None),
    ],
)
def test_error_param(message: str, param: str | None) -> None:
    assert error_param(message) == param


def test_malformed_json_is_400_and_schema_errors_are_422() -> None:
    with pytest.raises(ApiError) as bad:
        decode_request(b"{nope", CHAT)
    assert (bad.value.status, bad.value.code) == (400, "invalid_json")
    with pytest.raises(ApiError) as invalid:
        decode_request(b'{"model": "m", "messages": [{"role": "user", "content": 5}]}', CHAT)
    assert (invalid.value.status, invalid.value.code) == (422, "invalid_value")
    assert invalid.value.param == "messages[0].content"


def test_chat_text_parts_and_max_completion_tokens() -> None:
    request = decode_request(
        b'{"model": "m", "max_tokens": 9, "max_completion_tokens": 5, "messages": ['
        b'{"role": "user", "content": [{"type": "text", "text": "a"},'
        b' {"type": "text", "text": "b"}]}]}',
        CHAT,
    )
    assert request.texts() == ["ab"]
    assert request.requested_max_tokens() == 5
    assert not request.streaming
    assert not request.include_usage


def test_forwardable_drops_priority_stream_options_and_unset_fields() -> None:
    request = decode_request(
        b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "priority": -100,'
        b' "stream": true, "stream_options": {"include_usage": true}, "temperature": 0}',
        CHAT,
    )
    assert request.include_usage
    assert forwardable(request) == {
        "model": "m",
        "messages": [{"role": "user", "content": "x"}],
        "temperature": 0.0,
        "stream": True,
    }


def test_completion_and_embedding_inputs() -> None:
    completion = decode_request(
        b'{"model": "m", "prompt": ["only one"]}', msgspec.json.Decoder(CompletionRequest)
    )
    assert completion.texts() == ["only one"]
    embedding = decode_request(
        b'{"model": "e", "input": ["a", "b"], "encoding_format": "base64"}',
        msgspec.json.Decoder(EmbeddingRequest),
    )
    assert embedding.texts() == ["a", "b"]
    assert forwardable(embedding)["encoding_format"] == "base64"
    with pytest.raises(ApiError) as info:
        decode_request(b'{"model": "e", "input": []}', msgspec.json.Decoder(EmbeddingRequest))
    assert info.value.param == "input"
