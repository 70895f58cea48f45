"""Request bodies of the OpenAI routes, as msgspec Structs, and their decoding.

Unknown fields are refused (422 naming the field) rather than silently dropped: a client that
sends ``tools`` or ``logprobs`` learns at once that this gateway does not serve them. Only the
fields below are forwarded upstream; ``priority`` is accepted for compatibility and ignored
(the band comes from the request class). Malformed JSON is a 400 ``invalid_json``; a body that
parses but breaks the schema is a 422 ``invalid_value`` whose ``param`` is the field path.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, TypeVar

import msgspec

from runtime.gateway.errors import ApiError

NonEmpty = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
MaxTokens = Annotated[int, msgspec.Meta(ge=1)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, msgspec.Meta(gt=0.0, le=1.0)]
Penalty = Annotated[float, msgspec.Meta(ge=-2.0, le=2.0)]
OnlyOne = Annotated[int, msgspec.Meta(ge=1, le=1, description="only n=1 is served")]
Stop = str | Annotated[list[str], msgspec.Meta(max_length=4)]


class StreamOptions(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    include_usage: bool = False


class TextPart(msgspec.Struct, forbid_unknown_fields=True):
    type: Literal["text"]
    text: str


class ChatMessage(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


class _Common(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True, kw_only=True):
    model: NonEmpty
    user: str | None = None
    priority: int | None = None  # accepted, ignored: the band comes from the request class


class _Sampling(_Common, kw_only=True):
    max_tokens: MaxTokens | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    n: OnlyOne | None = None
    stop: Stop | None = None
    seed: int | None = None
    presence_penalty: Penalty | None = None
    frequency_penalty: Penalty | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens


class ChatRequest(_Sampling, kw_only=True):
    messages: Annotated[list[ChatMessage], msgspec.Meta(min_length=1)]
    max_completion_tokens: MaxTokens | None = None

    def requested_max_tokens(self) -> int | None:
        if self.max_completion_tokens is not None:
            return self.max_completion_tokens
        return self.max_tokens

    def texts(self) -> list[str]:
        return [m.text() for m in self.messages]


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | Annotated[list[str], msgspec.Meta(min_length=1, max_length=1)]

    def texts(self) -> list[str]:
        return [self.prompt] if isinstance(self.prompt, str) else list(self.prompt)


class EmbeddingRequest(_Common, kw_only=True):
    input: str | Annotated[list[str], msgspec.Meta(min_length=1, max_length=2048)]
    encoding_format: Literal["float", "base64"] | None = None
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None

    def texts(self) -> list[str]:
        return [self.input] if isinstance(self.input, str) else list(self.input)


InferenceRequest = ChatRequest | CompletionRequest | EmbeddingRequest
R = TypeVar("R", ChatRequest, CompletionRequest, EmbeddingRequest)

_AT = re.compile(r" - at `\$\.?(?P<path>[^`]*)`$")
_FIELD = re.compile(r"(?:missing required|contains unknown) field `(?P<field>[^`]+)`")


def error_param(message: str) -> str | None:
    """The field path a msgspec validation message points at (``messages[0].role``)."""
    at = _AT.search(message)
    path = at.group("path") if at else ""
    field = _FIELD.search(message)
    if field:
        name = field.group("field")
        path = f"{path}.{name}" if path else name
    return path or None


def decode_request(body: bytes, decoder: msgspec.json.Decoder[R]) -> R:
    """Parse ``body``; raises ApiError 400 (not JSON) or 422 (schema)."""
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        message = str(exc)
        raise ApiError.of("invalid_value", message, param=error_param(message)) from None
    except msgspec.DecodeError as exc:
        raise ApiError.of("invalid_json", f"request body is not valid JSON: {exc}") from None


def forwardable(request: InferenceRequest) -> dict[str, Any]:
    """The fields set by the client, as plain data, minus the ones never forwarded."""
    document: dict[str, Any] = msgspec.to_builtins(request)
    document.pop("priority", None)
    document.pop("stream_options", None)
    return document
