"""Parsing and validating OpenAI-style request bodies, with vLLM 0.32's error rules.

Length rules (as vLLM 0.32): a prompt longer than ``max_model_len`` is a 400; a ``max_tokens``
below 1 or above ``max_model_len`` is a 400; otherwise ``max_tokens`` is clamped to
``max_model_len - prompt_tokens`` (a prompt that leaves no room for one token is a 400).

Output length: with ``max_tokens`` given (or ``ignore_eos``), a request generates exactly its
budget and finishes with "length". Without ``max_tokens`` it stops on its own ("stop") after a
deterministic length in ``[1, min(budget, NATURAL_MAX_TOKENS)]`` derived from its seed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Container
from dataclasses import dataclass
from typing import Any, Literal

import msgspec

from runtime.workers.simulator.config import SimulatorConfig
from runtime.workers.simulator.prefix_cache import (
    render_chat,
    render_text,
    text_block_hashes,
    token_block_hashes,
)
from runtime.workers.simulator.text import (
    count_chat_tokens,
    count_text_tokens,
    derive_seed,
    scripted_tokens,
)

NATURAL_MAX_TOKENS = 256


class ApiError(Exception):
    """A client-visible error; the server renders it as vLLM's error JSON."""

    def __init__(
        self,
        message: str,
        *,
        status: int = 400,
        err_type: str = "BadRequestError",
        param: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.err_type = err_type
        self.param = param


@dataclass(frozen=True, slots=True)
class GenerationRequest:
    """A validated completion or chat request."""

    kind: Literal["completion", "chat"]
    prompt_tokens: int
    max_tokens: int  # the budget after clamping: what the KV reservation covers
    output_tokens: int  # what will actually be generated
    finish_reason: str
    stream: bool
    include_usage: bool
    continuous_usage: bool
    priority: int
    seed: int
    block_hashes: tuple[int, ...] = ()  # the prompt's full blocks (empty: caching off)
    rendered: str = ""  # the text prompt as 4-character tokens ("" for token ids or no cache)
    script: tuple[str, ...] = ()  # tokens a prompt's [[emit: ...]] markers ask for (text.py)


@dataclass(frozen=True, slots=True)
class EmbeddingRequest:
    """A validated embeddings request: (token count, seed) per input."""

    inputs: tuple[tuple[int, int], ...]
    encoding_format: Literal["float", "base64"]
    priority: int

    @property
    def prompt_tokens(self) -> int:
        return sum(tokens for tokens, _ in self.inputs)


def parse_body(raw: bytes) -> dict[str, Any]:
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ApiError(f"Request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError("Request body must be a JSON object")
    return body


def check_model(
    body: dict[str, Any], config: SimulatorConfig, adapters: Container[str] = ()
) -> str:
    """The model to answer as: 404 unless ``model`` is absent, the served name or a loaded
    LoRA adapter (as vLLM's ``_check_model``)."""
    model = body.get("model")
    if model is None or model in ("", config.model):
        return config.model
    if isinstance(model, str) and model in adapters:
        return model
    raise ApiError(
        f"The model `{model}` does not exist. Valid aliases: {config.model}.",
        status=404,
        err_type="NotFoundError",
        param="model",
    )


def parse_completion(body: dict[str, Any], config: SimulatorConfig) -> GenerationRequest:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
        prompt = prompt[0]  # a batch of one prompt
    cache = config.prefix_cache
    if isinstance(prompt, str):
        tokens, key = count_text_tokens(prompt), prompt
        rendered = render_text(prompt) if cache.enabled else ""
        hashes = text_block_hashes(rendered, cache.block_size) if cache.enabled else ()
    elif isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        tokens, key, rendered = len(prompt), repr(prompt), ""
        hashes = token_block_hashes(prompt, cache.block_size) if cache.enabled else ()
    elif isinstance(prompt, list) and len(prompt) > 1:
        raise ApiError("The simulator serves one prompt per request.", param="prompt")
    else:
        raise ApiError("prompt must be a string or a list of token ids", param="prompt")
    gen = _generation("completion", body, config, tokens, key, body.get("max_tokens"))
    gen = _scripted(gen, key if isinstance(prompt, str) else "")
    return dataclasses.replace(gen, block_hashes=hashes, rendered=rendered)


def parse_chat(body: dict[str, Any], config: SimulatorConfig) -> GenerationRequest:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("messages must be a non-empty list", param="messages")
    contents: list[str] = []
    roles: list[str] = []
    for message in messages:
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise ApiError("every message needs a string role", param="messages")
        contents.append(_message_text(message.get("content")))
        roles.append(message["role"])
    requested = body.get("max_completion_tokens")
    param = "max_completion_tokens"
    if requested is None:
        requested, param = body.get("max_tokens"), "max_tokens"
    template = _template_flags(body)
    key = "\x1e".join(contents)
    tokens = count_chat_tokens(contents, **template)
    gen = _generation("chat", body, config, tokens, key, requested, param)
    gen = _scripted(gen, key)
    cache = config.prefix_cache
    if not cache.enabled:
        return gen
    rendered = render_chat(list(zip(roles, contents, strict=True)), **template)
    return dataclasses.replace(
        gen, rendered=rendered, block_hashes=text_block_hashes(rendered, cache.block_size)
    )


def _template_flags(body: dict[str, Any]) -> dict[str, bool]:
    """vLLM's chat-template options, with its 400 for asking for both: the final message left
    open (``continue_final_message``, default false), a generation prompt appended
    (``add_generation_prompt``, default true, and not appended to an open message)."""
    flags: dict[str, bool] = {}
    for name, default in (("add_generation_prompt", True), ("continue_final_message", False)):
        value = body.get(name)
        if value is not None and not isinstance(value, bool):
            raise ApiError(f"{name} must be a boolean", param=name)
        flags[name] = default if value is None else value
    if body.get("continue_final_message") and body.get("add_generation_prompt"):
        raise ApiError(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True."
        )
    return flags


def parse_embedding(body: dict[str, Any], config: SimulatorConfig) -> EmbeddingRequest:
    raw = body.get("input")
    items: list[Any]
    if isinstance(raw, str) or (isinstance(raw, list) and raw and all(_is_int(t) for t in raw)):
        items = [raw]
    elif isinstance(raw, list) and raw:
        items = raw
    else:
        raise ApiError("input must be a string, a list of strings or token ids", param="input")
    inputs: list[tuple[int, int]] = []
    for item in items:
        if isinstance(item, str):
            tokens = count_text_tokens(item)
        elif isinstance(item, list) and item and all(_is_int(t) for t in item):
            tokens = len(item)
        else:
            raise ApiError("input must be a string, a list of strings or token ids", param="input")
        _check_prompt_length(tokens, config)
        inputs.append((tokens, derive_seed(config.seed, "embedding", repr(item))))
    encoding: Literal["float", "base64"]
    match body.get("encoding_format"):
        case None | "float":
            encoding = "float"
        case "base64":
            encoding = "base64"
        case _:
            raise ApiError("encoding_format must be 'float' or 'base64'", param="encoding_format")
    dimensions = body.get("dimensions")
    if dimensions is not None and dimensions != config.embedding_dim:
        raise ApiError(
            f"Model {config.model!r} does not support matryoshka representation, "
            "changing output dimensions will lead to poor results.",
            param="dimensions",
        )
    return EmbeddingRequest(
        inputs=tuple(inputs), encoding_format=encoding, priority=_priority(body)
    )


def _generation(  # noqa: PLR0917 - private helper shared by the two parsers
    kind: Literal["completion", "chat"],
    body: dict[str, Any],
    config: SimulatorConfig,
    prompt_tokens: int,
    key: str,
    requested: Any,
    param: str = "max_tokens",
) -> GenerationRequest:
    n = body.get("n")
    if n is not None and n != 1:
        raise ApiError("The simulator supports n=1 only.", param="n")
    stream = body.get("stream") or False
    options = body.get("stream_options")
    if options is not None and not stream:
        raise ApiError(
            "Stream options can only be defined when `stream=True`.", param="stream_options"
        )
    if options is not None and not isinstance(options, dict):
        raise ApiError("stream_options must be an object", param="stream_options")
    include_usage = bool(options and options.get("include_usage"))
    priority = _priority(body)
    seed = derive_seed(config.seed, body.get("seed"), key)
    max_tokens = _budget(prompt_tokens, requested, param, config)
    if requested is not None or body.get("ignore_eos"):
        output, reason = max_tokens, "length"
    else:
        output = 1 + seed % min(max_tokens, NATURAL_MAX_TOKENS)
        reason = "length" if output == max_tokens else "stop"
    return GenerationRequest(
        kind=kind,
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        output_tokens=output,
        finish_reason=reason,
        stream=bool(stream),
        include_usage=include_usage,
        continuous_usage=include_usage and bool(options and options.get("continuous_usage_stats")),
        priority=priority,
        seed=seed,
    )


def _scripted(gen: GenerationRequest, prompt: str) -> GenerationRequest:
    """``gen`` with the tokens its prompt's ``[[emit: ...]]`` markers ask for (the test hook);
    a request that would stop on its own sooner runs until they are out (within its budget)."""
    script = scripted_tokens(prompt)
    if not script:
        return gen
    output = max(gen.output_tokens, min(len(script), gen.max_tokens))
    reason = "length" if output == gen.max_tokens else gen.finish_reason
    return dataclasses.replace(gen, script=script, output_tokens=output, finish_reason=reason)


def _budget(prompt_tokens: int, requested: Any, param: str, config: SimulatorConfig) -> int:
    """The output budget as vLLM's ``get_max_tokens`` computes it, with its 400s."""
    limit = config.max_model_len
    _check_prompt_length(prompt_tokens, config)
    if requested is not None:
        if not _is_int(requested) or requested < 1:
            raise ApiError(f"{param} must be at least 1, got {requested}.", param=param)
        if requested > limit:
            raise ApiError(
                f"{param}={requested} cannot be greater than max_model_len={limit}. "
                "Please request fewer output tokens.",
                param=param,
            )
    budget = limit - prompt_tokens if requested is None else min(requested, limit - prompt_tokens)
    if budget < 1:
        raise ApiError(
            f"This model's maximum context length is {limit} tokens. However, your prompt "
            f"contains {prompt_tokens} input tokens, which leaves no room for output tokens. "
            "Please reduce the length of the input prompt.",
            param="input_tokens",
        )
    return int(budget)


def _check_prompt_length(prompt_tokens: int, config: SimulatorConfig) -> None:
    if prompt_tokens > config.max_model_len:
        raise ApiError(
            f"This model's maximum context length is {config.max_model_len} tokens. However, "
            f"your prompt contains {prompt_tokens} input tokens, which exceeds this limit even "
            "without any output tokens. Please reduce the length of the input prompt.",
            param="input_tokens",
        )


def _priority(body: dict[str, Any]) -> int:
    """vLLM's ``priority`` extension: an integer, lower is served first (default 0)."""
    priority = body.get("priority", 0)
    if not _is_int(priority):
        raise ApiError("priority must be an integer", param="priority")
    return int(priority)


def _message_text(content: Any) -> str:
    """The text of a message's content: a string, or the text parts of a list of parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    raise ApiError("message content must be a string or a list of parts", param="messages")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
