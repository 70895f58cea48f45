"""Response bodies and SSE frames in vLLM 0.32's OpenAI-compatible wire format."""

from __future__ import annotations

import base64
import struct
import time
import uuid
from collections.abc import Mapping
from typing import Any

import msgspec

DONE_FRAME = b"data: [DONE]\n\n"
_ENCODER = msgspec.json.Encoder()

Json = dict[str, Any]


def request_id(header: str | None) -> str:
    """vLLM's base request id: the ``X-Request-Id`` header, else a random uuid (hex)."""
    return header if header else uuid.uuid4().hex


def now() -> int:
    return int(time.time())


def encode(payload: Json) -> bytes:
    return _ENCODER.encode(payload)


def sse(payload: Json) -> bytes:
    """One server-sent event: ``data: {json}\\n\\n``."""
    return b"data: " + _ENCODER.encode(payload) + b"\n\n"


def usage(prompt_tokens: int, completion_tokens: int) -> Json:
    return {
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "completion_tokens": completion_tokens,
        "prompt_tokens_details": None,
    }


def error(message: str, *, err_type: str, status: int, param: str | None) -> Json:
    return {"error": {"message": message, "type": err_type, "param": param, "code": status}}


def models(
    model: str, max_model_len: int, created: int, adapters: Mapping[str, str] | None = None
) -> Json:
    """The model list: the base, then each loaded LoRA adapter (``parent`` = the base)."""
    cards = [_card(model, max_model_len, created)]
    for name, path in (adapters or {}).items():
        cards.append({**_card(name, max_model_len, created), "root": path, "parent": model})
    return {"object": "list", "data": cards}


def _card(model: str, max_model_len: int, created: int) -> dict[str, Any]:
    return {
        "id": model,
        "object": "model",
        "created": created,
        "owned_by": "vllm",
        "root": model,
        "parent": None,
        "max_model_len": max_model_len,
        "permission": [
            {
                "id": f"modelperm-{uuid.uuid4().hex}",
                "object": "model_permission",
                "created": created,
                "allow_create_engine": False,
                "allow_sampling": True,
                "allow_logprobs": True,
                "allow_search_indices": False,
                "allow_view": True,
                "allow_fine_tuning": False,
                "organization": "*",
                "group": None,
                "is_blocking": False,
            }
        ],
    }


class Framer:
    """Builds one request's bodies and chunks (completion or chat flavour)."""

    def __init__(self, *, chat: bool, rid: str, model: str) -> None:
        self.chat = chat
        self.id = f"chatcmpl-{rid}" if chat else f"cmpl-{rid}"
        self.model = model
        self.created = now()

    def full(
        self, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
    ) -> Json:
        """The non-streaming response body."""
        choice: Json
        if self.chat:
            message = {
                "role": "assistant",
                "content": text,
                "refusal": None,
                "annotations": None,
                "audio": None,
                "function_call": None,
                "reasoning": None,
            }
            choice = {"index": 0, "message": message, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice.update(finish_reason=finish_reason, stop_reason=None)
        body: Json = {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "service_tier": None,
            "system_fingerprint": None,
            "usage": usage(prompt_tokens, completion_tokens),
        }
        if self.chat:
            body["prompt_logprobs"] = None
        return body

    def first_chunk(self) -> Json | None:
        """Chat streams open with the assistant role and empty content; completions do not."""
        if not self.chat:
            return None
        choice = {
            "index": 0,
            "delta": {"role": "assistant", "content": ""},
            "logprobs": None,
            "finish_reason": None,
        }
        return self._chunk(choice)

    def delta(self, text: str, finish_reason: str | None) -> Json:
        """A chunk carrying newly generated text (and the finish reason on the last one)."""
        choice: Json
        if self.chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None}
        else:
            choice = {"index": 0, "text": text, "logprobs": None}
        choice["finish_reason"] = finish_reason
        if finish_reason is not None or not self.chat:
            choice["stop_reason"] = None
        return self._chunk(choice)

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> Json:
        """The final chunk of a stream with ``include_usage``: no choices, the usage."""
        chunk = self._chunk(None)
        chunk["usage"] = usage(prompt_tokens, completion_tokens)
        del chunk["usage"]["prompt_tokens_details"]  # serialized with exclude_none in vLLM
        return chunk

    def _chunk(self, choice: Json | None) -> Json:
        return {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": [] if choice is None else [choice],
        }


def embeddings(
    *, rid: str, model: str, vectors: list[list[float]], encoding: str, prompt_tokens: int
) -> Json:
    data: list[Json] = []
    for index, vector in enumerate(vectors):
        value: list[float] | str = vector
        if encoding == "base64":
            value = base64.b64encode(struct.pack(f"<{len(vector)}f", *vector)).decode()
        data.append({"index": index, "object": "embedding", "embedding": value})
    return {
        "id": f"embd-{rid}",
        "object": "list",
        "created": now(),
        "model": model,
        "data": data,
        "usage": usage(prompt_tokens, 0),
    }
