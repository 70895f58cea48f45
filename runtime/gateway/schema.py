"""Request bodies of the OpenAI routes: what the router reads, and the document it forwards.

The router is transparent: it decodes the body once into a plain JSON document (a dict, kept
to forward) and converts the few keys it uses into a typed view (:class:`ChatRequest`,
:class:`CompletionRequest`, :class:`EmbeddingRequest`) with ``msgspec.convert`` (no second
parse of the bytes). Every other field, top level or inside a message or content part
(``tools``, ``tool_choice``, ``response_format``, ``logprobs``, ``tool_calls``,
``tool_call_id``, ``image_url`` parts, vLLM's ``top_k`` / ``ignore_eos`` / ``guided_json``
...), is forwarded unchanged, and the engine judges it. The views check only what the router
relies on (the model name, the token estimate's inputs, ``max_tokens``, ``n``, ``stream``,
``stream_options``, ``temperature``, ``seed``, ``user``).

Errors: a body that is not JSON (or not UTF-8) is a 400 ``invalid_json``; a document whose
router-read fields have the wrong shape is a 400 ``invalid_value`` whose ``param`` is the
field path (``messages[0].role``).
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Generic, TypeVar

import msgspec

from runtime.gateway.errors import ApiError

NonEmpty = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
MaxTokens = Annotated[int, msgspec.Meta(ge=1)]
Choices = Annotated[int, msgspec.Meta(ge=1, le=128)]
Temperature = Annotated[float, msgspec.Meta(ge=0.0)]
TokenIds = list[int]
MAX_INPUTS = 2048  # embedding inputs / completion prompts in one request


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class ContentPart(msgspec.Struct):
    """A chat content part of any type; only ``text`` parts count toward the estimate."""

    type: str = ""
    text: str | None = None


class ChatMessage(msgspec.Struct):
    role: NonEmpty
    content: str | list[ContentPart] | None = None  # None: an assistant turn of tool_calls

    def text(self) -> str:
        content = self.content
        if content is None:
            return ""
        if isinstance(content, str):
            return content
        return "".join(part.text for part in content if part.text is not None)


class _Common(msgspec.Struct, kw_only=True):
    model: NonEmpty
    user: str | None = None


class _Sampling(_Common, kw_only=True):
    max_tokens: MaxTokens | None = None
    n: Choices | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    temperature: Temperature | None = None
    seed: int | None = None

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    @property
    def choices(self) -> int:
        return self.n or 1

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


def _inputs(value: str | list[str | int | TokenIds], param: str) -> tuple[list[str], list[int]]:
    """Texts and per-text token allowances of a ``prompt`` / ``input``: a string, a list of
    strings, a token array, or a list of token arrays (a token id counts as one token)."""
    if isinstance(value, str):
        return [value], [0]
    if not value or len(value) > MAX_INPUTS:
        raise ApiError.of(
            "invalid_value",
            param=param,
            reason=f"{param} must hold between 1 and {MAX_INPUTS} items",
        )
    if all(isinstance(item, int) for item in value):
        return [""], [len(value)]
    if all(isinstance(item, str) for item in value):
        return [str(item) for item in value], [0] * len(value)
    if all(isinstance(item, list) for item in value):
        return [""] * len(value), [len(item) for item in value if isinstance(item, list)]
    raise ApiError.of(
        "invalid_value",
        param=param,
        reason=f"{param} must be a string, a list of strings, a token array or a list of "
        "token arrays",
    )


class CompletionRequest(_Sampling, kw_only=True):
    prompt: str | list[str | int | TokenIds]

    def inputs(self) -> tuple[list[str], list[int]]:
        return _inputs(self.prompt, "prompt")

    def texts(self) -> list[str]:
        return self.inputs()[0]


class EmbeddingRequest(_Common, kw_only=True):
    input: str | list[str | int | TokenIds]

    def inputs(self) -> tuple[list[str], list[int]]:
        return _inputs(self.input, "input")

    def texts(self) -> list[str]:
        return self.inputs()[0]


InferenceRequest = ChatRequest | CompletionRequest | EmbeddingRequest
R = TypeVar("R", ChatRequest, CompletionRequest, EmbeddingRequest)


class Decoded(msgspec.Struct, Generic[R]):
    """The typed view of the fields the router reads, and the whole document to forward."""

    request: R
    document: dict[str, Any]


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


class RequestDecoder(Generic[R]):
    """Decodes a route's body: one JSON parse into a document, one convert into the view."""

    __slots__ = ("_json", "view")

    def __init__(self, view: type[R]) -> None:
        self.view: type[R] = view
        self._json: msgspec.json.Decoder[dict[str, Any]] = msgspec.json.Decoder(dict[str, Any])

    def decode(self, body: bytes) -> Decoded[R]:
        """Parse ``body``; raises ApiError 400 ``invalid_json`` or ``invalid_value``."""
        try:
            document = self._json.decode(body)
            request = msgspec.convert(document, self.view)
        except msgspec.ValidationError as exc:
            message = str(exc)
            raise ApiError.of("invalid_value", param=error_param(message), reason=message) from None
        except msgspec.DecodeError as exc:
            raise ApiError.of("invalid_json", reason=str(exc)) from None
        except UnicodeDecodeError as exc:  # invalid UTF-8 inside a string
            raise ApiError.of("invalid_json", reason=f"invalid UTF-8 at byte {exc.start}") from None
        return Decoded(request, document)


def decode_request(body: bytes, decoder: RequestDecoder[R]) -> Decoded[R]:
    """``decoder.decode(body)`` (kept as the call the routes make)."""
    return decoder.decode(body)
