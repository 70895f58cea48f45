"""Resume a generation by continuation: what was streamed so far, the request that goes on
from there, and the continuation's chunks rewritten into the client's one stream.

Pure functions over bytes and documents; :mod:`runtime.gateway.migrate` calls them when a
stream breaks. Nothing here runs while a stream is healthy: the relayed payloads are kept
as the raw bytes the engine sent and decoded only here.

The continuation of a chat request is the original ``messages`` plus an assistant message
holding the text so far, with ``continue_final_message: true`` and
``add_generation_prompt: false`` (vLLM renders the chat template up to that text, with no
end of turn); of a completion, the prompt followed by the text so far. ``max_tokens`` (and
``min_tokens``) shrink by the tokens already generated.

**Exactness bound.** With greedy decoding (``temperature: 0``) the resumed stream is
identical to the uninterrupted one when the tokenization round-trips: the engine's tokens of
the continuation's prompt are the original prompt's tokens followed by exactly the tokens
generated so far. That holds for a completion whenever ``tokenize(prompt + text) ==
tokenize(prompt) + generated`` (BPE can merge across the seam, e.g. a prompt ending in
``"the"`` and a generated ``"re"``), and for a chat request when, in addition, the template
renders a partial assistant message exactly as its generation prompt followed by the text
(the demo model's template does not: its generation prompt is ``assistant:`` and its
assistant turn ``assistant: <text>``, one space more). When the tokenization does not
round-trip, the text so far is kept verbatim and the rest is a correct continuation of it
from slightly different tokens, which can diverge from what the engine would have
generated. With sampling (``temperature > 0``) the continuation is another sample of the
same distribution, never a replay; a ``seed`` restarts at the continuation. One streamed
chunk counts as one token: exact while vLLM keeps up (a completions chunk per decode step,
with empty text while the step's bytes are not a character yet); a lower bound when vLLM's
chat stream skips such a step or a loaded vLLM merges unsent deltas into one chunk (billing
never counts a token twice, and the shrunken ``max_tokens`` may allow the uncounted tokens
again). :mod:`runtime.gateway.migrate` therefore also counts the text so far with the
model's tokenizer, when the version has one, and keeps the larger count (exact when the
tokenization round-trips).

Not resumable (the stream ends with today's terminal error event): ``n`` > 1, ``best_of``,
``echo``, ``logprobs``, a ``suffix``, structured output (``response_format`` other than
text, ``guided_*``, ``structured_outputs``), tool calls or reasoning deltas in the stream, a
completion whose prompt is not one string, a stream whose final chunk was already relayed.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import msgspec

from runtime.gateway.relay import Usage

_DECODER = msgspec.json.Decoder()
_ENCODER = msgspec.json.Encoder()
_STRUCTURED = (
    "guided_json", "guided_regex", "guided_choice", "guided_grammar", "structured_outputs",
)  # fmt: skip
CONTEXT_EXCEEDED_MARKERS = (b"maximum context length", b"context length", b"too long")


class NotResumable(Exception):  # noqa: N818 (a verdict, raised and caught inside the gateway)
    """The stream cannot be resumed; the message says why (a metric's reason label)."""


class Progress(msgspec.Struct, kw_only=True):
    """What the client has received: the text, the generated chunks (tokens), and the
    stream's own id, creation time and model, which the continuation keeps."""

    text: str = ""
    tokens: int = 0
    chunk_id: str = ""
    created: int = 0
    model: str = ""


def progress_of(kind: str, payloads: Iterable[bytes]) -> Progress:
    """Decode the relayed payloads (only when a stream broke); raises NotResumable (also
    once a choice's final chunk was relayed: nothing is left to resume)."""
    progress = Progress()
    parts: list[str] = []
    for payload in payloads:
        try:
            event = _DECODER.decode(payload)
        except msgspec.DecodeError:
            raise NotResumable("undecodable") from None
        if not isinstance(event, dict):
            raise NotResumable("undecodable")
        if not progress.chunk_id:
            progress.chunk_id = str(event.get("id") or "")
            progress.created = int(event.get("created") or 0)
            progress.model = str(event.get("model") or "")
        choices = event.get("choices") or []
        if not choices:
            continue  # a usage-only chunk
        if len(choices) > 1 or (choices[0].get("index") or 0) != 0:
            raise NotResumable("several_choices")
        choice = choices[0]
        if choice.get("finish_reason") is not None:
            raise NotResumable("finished")  # its final chunk went out: nothing to resume
        if kind == "chat":
            delta = choice.get("delta") or {}
            if set(delta) - {"role", "content"} and any(
                delta.get(key) for key in set(delta) - {"role", "content"}
            ):
                raise NotResumable("not_text")  # tool calls, reasoning: not a text prefix
            if "role" in delta and not delta.get("content"):
                continue  # the opening role chunk: no token
            parts.append(delta.get("content") or "")
        else:
            parts.append(choice.get("text") or "")
        progress.tokens += 1
    progress.text = "".join(parts)
    return progress


def check_resumable(kind: str, document: dict[str, Any]) -> None:
    """Refuse, before anything streams, a request whose stream cannot be resumed."""
    if kind not in ("chat", "completion"):
        raise NotResumable("kind")
    if (document.get("n") or 1) != 1 or (document.get("best_of") or 1) != 1:
        raise NotResumable("several_choices")
    if document.get("echo") or document.get("logprobs") or document.get("top_logprobs"):
        raise NotResumable("logprobs")
    if document.get("suffix") or any(document.get(name) for name in _STRUCTURED):
        raise NotResumable("structured")
    response_format = document.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type", "text") != "text":
        raise NotResumable("structured")
    if kind == "completion":
        prompt = document.get("prompt")
        if not isinstance(prompt, str) and not (
            isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str)
        ):
            raise NotResumable("prompt_shape")
    elif not isinstance(document.get("messages"), list):
        raise NotResumable("prompt_shape")


def continuation(kind: str, document: dict[str, Any], progress: Progress) -> dict[str, Any] | None:
    """The request that continues ``document`` after ``progress``; None when its output
    budget is spent (the generation ends with ``finish_reason: "length"``)."""
    body = dict(document)
    budget = int(body.pop("max_completion_tokens", None) or body.get("max_tokens") or 0)
    left = budget - progress.tokens
    if left <= 0:
        return None
    body["max_tokens"] = left
    if body.get("min_tokens"):
        body["min_tokens"] = max(0, int(body["min_tokens"]) - progress.tokens)
    if kind == "chat":
        messages = list(body["messages"])
        last = messages[-1] if messages else None
        if body.get("continue_final_message") and isinstance(last, dict):
            # the client continued its own assistant message: the text extends it
            messages[-1] = {**last, "content": _text_of(last.get("content")) + progress.text}
        else:
            messages.append({"role": "assistant", "content": progress.text})
        body["messages"] = messages
        body["continue_final_message"] = True
        body["add_generation_prompt"] = False
    else:
        prompt = body["prompt"]
        body["prompt"] = (
            prompt + progress.text if isinstance(prompt, str) else [prompt[0] + progress.text]
        )
    return body


def _text_of(content: object) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(
            str(part.get("text") or "")
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def context_exceeded(body: bytes) -> bool:
    """An engine's 400 that says the prompt (here: prompt + text so far) is over the context."""
    lowered = body.lower()
    return any(marker in lowered for marker in CONTEXT_EXCEEDED_MARKERS)


class Seam:
    """Rewrites a continuation's chunks into the client's stream: the stream's own id and
    creation time, no second role chunk, and usage counting each token once: prompt tokens
    are the continuation's prompt less the tokens re-prefilled, completion tokens every token
    the client received."""

    __slots__ = ("kind", "progress", "seen")

    def __init__(self, kind: str, progress: Progress) -> None:
        self.kind = kind
        self.progress = progress
        self.seen = False

    def rewrite(self, payload: bytes) -> bytes | None:
        """The payload as the client's stream carries it; None to drop it."""
        try:
            event = _DECODER.decode(payload)
        except msgspec.DecodeError:
            return payload  # not ours to judge: relayed as it came
        if not isinstance(event, dict):
            return payload
        opening = not self.seen
        self.seen = True
        event["id"] = self.progress.chunk_id or event.get("id")
        if self.progress.created:
            event["created"] = self.progress.created
        choices = event.get("choices") or []
        for choice in choices:
            choice.pop("prompt_token_ids", None)  # vLLM's extension: the client had the prompt's
        if self.kind == "chat" and opening and choices:
            delta = choices[0].get("delta") or {}
            if "role" in delta:
                delta.pop("role")
                if not delta.get("content") and choices[0].get("finish_reason") is None:
                    return None  # the continuation's own role chunk: the client had one
        usage = event.get("usage")
        if isinstance(usage, dict):
            event["usage"] = msgspec.structs.asdict(self.usage(usage))
        return _ENCODER.encode(event)

    def usage(self, usage: dict[str, Any]) -> Usage:
        before = self.progress.tokens
        prompt = max(0, int(usage.get("prompt_tokens") or 0) - before)
        completion = before + int(usage.get("completion_tokens") or 0)
        return Usage(prompt_tokens=prompt, completion_tokens=completion,
                     total_tokens=prompt + completion)  # fmt: skip


def length_end(kind: str, progress: Progress, *, prompt_tokens: int) -> list[bytes]:
    """The payloads that end a stream whose generation cannot go on (its output budget or the
    model's context is spent): a final chunk with ``finish_reason: "length"`` and the usage."""
    head: dict[str, Any] = {
        "id": progress.chunk_id,
        "object": "chat.completion.chunk" if kind == "chat" else "text_completion",
        "created": progress.created,
        "model": progress.model,
    }
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if kind == "chat":
        choice["delta"] = {}
    else:
        choice["text"] = ""
    usage = Usage(prompt_tokens=prompt_tokens, completion_tokens=progress.tokens,
                  total_tokens=prompt_tokens + progress.tokens)  # fmt: skip
    return [
        _ENCODER.encode({**head, "choices": [choice]}),
        _ENCODER.encode({**head, "choices": [], "usage": msgspec.structs.asdict(usage)}),
    ]


def decode_document(body: bytes) -> dict[str, Any]:
    document = _DECODER.decode(body)
    if not isinstance(document, dict):
        raise NotResumable("prompt_shape")
    return document


def encode_document(document: dict[str, Any]) -> bytes:
    return _ENCODER.encode(document)
