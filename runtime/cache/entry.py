"""A stored completion, and its replay as a JSON body or as OpenAI SSE.

An entry keeps the whole answer of one choice: the content in the chunks it streamed in (one
chunk for a unary answer), the finish reason, the usage, the ids the client saw, and the raw
JSON body when the miss was unary (a unary hit returns it byte for byte). Answers that a
replay could not reproduce (tool calls, several choices, no usage, an error) are not entries:
:func:`from_unary` and :func:`from_stream` return None for them.
"""

from __future__ import annotations

from typing import Any

import msgspec


class CachedUsage(msgspec.Struct, frozen=True):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class Entry(msgspec.Struct, frozen=True, kw_only=True):
    kind: str  # "chat" | "completion"
    id: str
    created: int
    model: str
    chunks: tuple[str, ...]
    finish_reason: str
    usage: CachedUsage
    fingerprint: str | None = None
    body: bytes | None = None  # the raw unary JSON, when the miss was unary


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(Entry)
_JSON = msgspec.json.Decoder(dict[str, Any])


def encode_entry(entry: Entry) -> bytes:
    return _ENCODER.encode(entry)


def decode_entry(raw: bytes) -> Entry | None:
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError:
        return None


def _usage(value: object) -> CachedUsage | None:
    if not isinstance(value, dict):
        return None
    try:
        return msgspec.convert(value, CachedUsage)
    except msgspec.ValidationError:
        return None


def from_unary(kind: str, body: bytes) -> Entry | None:
    """The entry of a unary 200 body, or None when a replay could not reproduce it."""
    try:
        doc = _JSON.decode(body)
    except msgspec.DecodeError:
        return None
    choices = doc.get("choices")
    usage = _usage(doc.get("usage"))
    if not isinstance(choices, list) or len(choices) != 1 or usage is None:
        return None
    choice = choices[0]
    if kind == "chat":
        message = choice.get("message") or {}
        if message.get("tool_calls") or not isinstance(message.get("content"), str):
            return None
        text = message["content"]
    else:
        text = choice.get("text")
        if not isinstance(text, str):
            return None
    return Entry(
        kind=kind, id=str(doc.get("id", "")), created=int(doc.get("created", 0)),
        model=str(doc.get("model", "")), chunks=(text,),
        finish_reason=str(choice.get("finish_reason") or "stop"), usage=usage,
        fingerprint=doc.get("system_fingerprint"), body=body,
    )  # fmt: skip


def parse_sse(data: bytes) -> list[bytes]:
    """The payloads of SSE ``data:`` frames, ``[DONE]`` left out."""
    payloads = []
    for raw in data.split(b"\n\n"):
        frame = raw.strip()
        if frame.startswith(b"data: ") and frame != b"data: [DONE]":
            payloads.append(frame[6:])
    return payloads


def from_stream(kind: str, payloads: list[bytes], usage: CachedUsage | None) -> Entry | None:
    """The entry of a complete stream's payloads, or None (tool calls, an error, no finish)."""
    chunks: list[str] = []
    finish = ""
    meta: dict[str, Any] = {}
    fingerprint = None
    for payload in payloads:
        try:
            doc = _JSON.decode(payload)
        except msgspec.DecodeError:
            return None
        if "error" in doc:
            return None
        meta = meta or doc
        fingerprint = doc.get("system_fingerprint") or fingerprint
        usage = _usage(doc.get("usage")) or usage
        for choice in doc.get("choices") or ():
            if choice.get("index", 0) != 0:
                return None
            if kind == "chat":
                delta = choice.get("delta") or {}
                if delta.get("tool_calls"):
                    return None
                text = delta.get("content")
            else:
                text = choice.get("text")
            if isinstance(text, str) and text:
                chunks.append(text)
            if choice.get("finish_reason"):
                finish = str(choice["finish_reason"])
    if not finish or finish == "error" or usage is None:
        return None
    return Entry(
        kind=kind, id=str(meta.get("id", "")), created=int(meta.get("created", 0)),
        model=str(meta.get("model", "")), chunks=tuple(chunks), finish_reason=finish,
        usage=usage, fingerprint=fingerprint,
    )  # fmt: skip


def unary_body(entry: Entry) -> bytes:
    """The JSON body of a unary hit: the stored one, else one built from the chunks."""
    if entry.body is not None:
        return entry.body
    text = "".join(entry.chunks)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": entry.finish_reason}
    if entry.kind == "chat":
        choice["message"] = {"role": "assistant", "content": text}
        obj = "chat.completion"
    else:
        choice["text"] = text
        obj = "text_completion"
    doc: dict[str, Any] = {"id": entry.id, "object": obj, "created": entry.created,
                           "model": entry.model, "choices": [choice],
                           "usage": msgspec.to_builtins(entry.usage)}  # fmt: skip
    if entry.fingerprint is not None:
        doc["system_fingerprint"] = entry.fingerprint
    return msgspec.json.encode(doc)


def _chunk(entry: Entry, choice: dict[str, Any] | None, **extra: Any) -> bytes:
    chat = entry.kind == "chat"
    doc: dict[str, Any] = {
        "id": entry.id, "object": "chat.completion.chunk" if chat else "text_completion",
        "created": entry.created, "model": entry.model,
        "choices": [choice] if choice is not None else [],
    }  # fmt: skip
    doc.update(extra)
    return b"data: " + msgspec.json.encode(doc) + b"\n\n"


def sse_frames(entry: Entry, *, include_usage: bool) -> list[bytes]:
    """A hit replayed in OpenAI's framing: role chunk (chat), content chunks, finish chunk,
    usage chunk when asked, ``[DONE]``."""
    chat = entry.kind == "chat"
    frames: list[bytes] = []

    def choice(text: str | None, finish: str | None, role: bool = False) -> dict[str, Any]:
        body: dict[str, Any] = {"index": 0}
        if chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            body["delta"] = delta
        else:
            body["text"] = text or ""
        body["logprobs"] = None
        body["finish_reason"] = finish
        return body

    if chat:
        frames.append(_chunk(entry, choice("", None, role=True)))
    frames.extend(_chunk(entry, choice(text, None)) for text in entry.chunks)
    stamp = {} if include_usage or entry.fingerprint is None else {
        "system_fingerprint": entry.fingerprint}  # fmt: skip
    frames.append(_chunk(entry, choice("" if not chat else None, entry.finish_reason), **stamp))
    if include_usage:
        frames.append(_chunk(entry, None, usage=msgspec.to_builtins(entry.usage)))
    frames.append(b"data: [DONE]\n\n")
    return frames
