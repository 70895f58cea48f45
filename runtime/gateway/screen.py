"""The post-filter's side of the relay: screen an answer's text as it goes out.

An :class:`OutputScreen` is made per request by the ``postfilter`` stage when stop rules (or
output classifier rules) are in force, and read by the relay and the cache replay:

- :meth:`OutputScreen.chunk`: one SSE payload's text deltas (per choice) fed to a
  :class:`runtime.safety.postfilter.StreamFilter`; on a stop it returns the frames that end
  the stream: the choice's text before the match, ``finish_reason: "content_filter"``, the
  usage chunk when the client asked for it (the prompt and the tokens generated up to the
  stop: what billing charges), then ``[DONE]``. The relay then closes the upstream response,
  so the engine drops the sequence.
- :meth:`OutputScreen.unary`: a whole JSON answer, checked before it is sent; a stopped
  choice keeps the text before the match and finishes with ``content_filter``.
- :meth:`OutputScreen.entry`: a cached answer replayed (a hit, an idempotent replay), screened
  under the packs in force now, not those of when it was stored.

Each stop is reported once through ``on_stop`` (the stage turns it into an intervention).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from runtime.cache.entry import Entry
from runtime.safety.compiled import CompiledPack
from runtime.safety.postfilter import Stop, StreamFilter, check_text

FINISH: str = "content_filter"


class _Delta(msgspec.Struct):
    content: str | None = None


class _Choice(msgspec.Struct):
    index: int = 0
    delta: _Delta | None = None
    text: str | None = None


class _Chunk(msgspec.Struct):
    id: str = ""
    created: int = 0
    model: str = ""
    choices: list[_Choice] = []


_CHUNK = msgspec.json.Decoder(_Chunk)
_JSON = msgspec.json.Decoder(dict[str, Any])


class OutputScreen:
    """One request's output check (see the module docstring)."""

    __slots__ = ("_filters", "_meta", "_packs", "include_usage", "kind", "on_stop",
                 "prompt_tokens", "stopped")  # fmt: skip

    def __init__(
        self, packs: Sequence[CompiledPack], *, kind: str, include_usage: bool,
        prompt_tokens: int, on_stop: Callable[[Stop], None],
    ) -> None:  # fmt: skip
        self._packs = tuple(packs)
        self.kind = kind
        self.include_usage = include_usage
        self.prompt_tokens = prompt_tokens
        self.on_stop = on_stop
        self._filters: dict[int, StreamFilter] = {}
        self._meta = _Chunk()
        self.stopped: Stop | None = None

    @property
    def active(self) -> bool:
        return any(p.stop.active for p in self._packs)

    def _stop(self, stop: Stop) -> Stop:
        if self.stopped is None:
            self.stopped = stop
            self.on_stop(stop)
        return stop

    def _filter(self, index: int) -> StreamFilter:
        found = self._filters.get(index)
        if found is None:
            found = self._filters[index] = StreamFilter(self._packs)
        return found

    # -- streams ------------------------------------------------------------------------------

    def chunk(self, payload: bytes, generated: int) -> bytes | None:
        """None: send ``payload`` on. Else the frames that end the stream (``generated``: the
        output tokens counted so far, this chunk's included)."""
        try:
            chunk = _CHUNK.decode(payload)
        except msgspec.DecodeError:
            return None  # not ours to judge: relayed as it came
        if not self._meta.id and chunk.id:
            self._meta = chunk
        for choice in chunk.choices:
            text = choice.delta.content if choice.delta is not None else choice.text
            if not text:
                continue
            stop = self._filter(choice.index).feed(text)
            if stop is not None:
                return self._end(self._stop(stop), choice.index, generated)
        return None

    def finish(self, generated: int) -> bytes | None:
        """The stream ended: a match held back at its very end is decided now."""
        for index, screen in self._filters.items():
            stop = screen.finish()
            if stop is not None:
                return self._end(self._stop(stop), index, generated)
        return None

    def _end(self, stop: Stop, index: int, generated: int) -> bytes:
        meta = self._meta
        created = meta.created or int(time.time())
        chat = self.kind == "chat"
        choice: dict[str, Any] = {"index": index, "logprobs": None, "finish_reason": FINISH}
        if chat:
            choice["delta"] = {"content": stop.emit} if stop.emit else {}
        else:
            choice["text"] = stop.emit
        kind = "chat.completion.chunk" if chat else "text_completion"
        head: dict[str, Any] = {"id": meta.id, "object": kind, "created": created,
                                "model": meta.model}  # fmt: skip
        frames = [{**head, "choices": [choice]}]
        if self.include_usage:
            frames.append({**head, "choices": [], "usage": self.usage(generated)})
        out = b"".join(b"data: " + msgspec.json.encode(f) + b"\n\n" for f in frames)
        return out + b"data: [DONE]\n\n"

    def usage(self, generated: int) -> dict[str, int]:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": generated,
                "total_tokens": self.prompt_tokens + generated}  # fmt: skip

    # -- whole answers ------------------------------------------------------------------------

    def unary(self, body: bytes) -> bytes | None:
        """None: send ``body`` as it is. Else the answer with its stopped choices cut."""
        try:
            document = _JSON.decode(body)
        except msgspec.DecodeError:
            return None
        changed = False
        for choice in document.get("choices") or ():
            if not isinstance(choice, dict):
                continue
            message = choice.get("message")
            holder, field = (message, "content") if isinstance(message, dict) else (choice, "text")
            text = holder.get(field)
            if not isinstance(text, str) or not text:
                continue
            stop = check_text(self._packs, text)
            if stop is not None:
                self._stop(stop)
                holder[field] = stop.emit
                choice["finish_reason"] = FINISH
                changed = True
        return msgspec.json.encode(document) if changed else None

    def entry(self, entry: Entry) -> Entry:
        """A stored answer as the packs in force let it out (cut at a stop, else as it is)."""
        stop = check_text(self._packs, "".join(entry.chunks))
        if stop is None:
            return entry
        self._stop(stop)
        kept: list[str] = []
        left = len(stop.emit)
        for piece in entry.chunks:
            if left <= 0:
                break
            kept.append(piece[:left])
            left -= len(piece)
        return msgspec.structs.replace(entry, chunks=tuple(kept), finish_reason=FINISH, body=None)
